"""The GPT on the device: the table of what a model allocates (buffers) and where parameters lie
(layout), one transformer block (block), the token table's embedding and head (head), the three
attention paths, the Model itself (gpt), sampling from the key/value cache (decode), the memory
budget (budget) and the per-kernel profile of a step (profile)."""
