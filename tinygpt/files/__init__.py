"""What tinygpt reads and writes: the .tinygpt checkpoint, token files, LoRA and PEFT
files, Hugging Face directories, optimizer state, the corpus, and the rules every write keeps."""
