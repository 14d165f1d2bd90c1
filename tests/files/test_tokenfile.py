"""Token files (tinygpt prepare, --data corpus.bin) and directories of text files (--data DIR):
the ids are the text's, the pair is checked before it is mapped, a file far past the text bound
trains without being read whole, and its windows are the array's."""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from support import ROOT
from tinygpt.files import data as D
from tinygpt.files import tokenfile as TF
from tinygpt.commands.cli import main
from tinygpt.files.data import DataError, Dataset
from tinygpt.tokenizers import ByteTokenizer

R50K = ROOT.parent / "shared" / "data" / "r50k_base.tiktoken"
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak. " * 400).encode()


def one_line(capsys, needle):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    return err[0]


def test_prepare_writes_the_bytes_and_a_sidecar(tmp_path, capsys):
    (tmp_path / "a.txt").write_bytes(TEXT)
    (tmp_path / "b.txt").write_bytes(TEXT[:999] + "é\n".encode())
    out = tmp_path / "c.bin"
    assert main(["prepare", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), "--out", str(out), "--quiet"]) == 0
    assert "train with: tinygpt train --data" in capsys.readouterr().err
    ids = np.fromfile(out, "<u2")
    want = np.frombuffer(TEXT + TEXT[:999] + "é\n".encode(), np.uint8)
    assert np.array_equal(ids, want)
    side = json.loads(TF.sidecar_of(out).read_text())
    assert (side["tokenizer"], side["vocab"], side["dtype"], side["tokens"]) == ("byte", 256, "uint16", len(want))
    assert [s["tokens"] for s in side["sources"]] == [len(TEXT), 1002]
    assert side["split"]["train"] == int(np.floor(0.9 * len(want)))
    assert side["sources"][0]["sha256"] == hashlib.sha256(TEXT).hexdigest()
    # ours: prepared again in place; a file of the user's is never replaced
    assert main(["prepare", str(tmp_path / "a.txt"), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    mine = tmp_path / "mine.bin"
    mine.write_bytes(b"my data")
    assert main(["prepare", str(tmp_path / "a.txt"), "--out", str(mine), "--quiet"]) == 2
    one_line(capsys, "not a token file written by tinygpt")
    assert mine.read_bytes() == b"my data" and not TF.sidecar_of(mine).exists()


@pytest.mark.skipif(not R50K.exists(), reason="needs ../shared/data/r50k_base.tiktoken")
def test_prepare_gpt2_in_chunks_gives_the_whole_texts_ids(tmp_path, monkeypatch, capsys):
    """Read 4 KB at a time (a UTF-8 character cut between reads, cuts where GPT-2's pre-tokenizer
    cuts): the ids are those of the whole text tokenized at once."""
    from tinygpt.tokenizers import get_tokenizer
    from tinygpt.tokenizers import gpt2
    text = (D.builtin_corpus()[:150_000].decode("utf-8", "ignore") + " naïve café — ünïcödé ") * 2
    (tmp_path / "t.txt").write_text(text, "utf-8")
    monkeypatch.setattr(TF, "CHUNK", 4096 + 1)
    monkeypatch.setattr(gpt2, "PIECE", 1000)      # the tokenizer's pieces, cut from its decoded chunks
    out = tmp_path / "g.bin"
    assert main(["prepare", str(tmp_path / "t.txt"), "--out", str(out), "--tokenizer", "gpt2",
                 "--tokenizer-file", str(R50K), "--quiet"]) == 0
    tok = get_tokenizer("gpt2", str(R50K))
    want = np.asarray(tok.enc.encode(text, disallowed_special=()))
    got = np.fromfile(out, "<u2")
    print(f"{len(got):,} gpt2 ids from {len(text.encode()):,} bytes read 4 KB at a time")
    assert np.array_equal(got, want)
    (tmp_path / "bad.txt").write_bytes(b"fine text " * 1000 + b"\xff\xfe" + b" more")
    capsys.readouterr()
    assert main(["prepare", str(tmp_path / "bad.txt"), "--out", str(tmp_path / "b.bin"), "--tokenizer", "gpt2",
                 "--tokenizer-file", str(R50K), "--quiet"]) == 1
    one_line(capsys, "not valid UTF-8 near byte 10,000")
    assert not (tmp_path / "b.bin").exists()


def test_a_token_file_is_checked_before_it_is_mapped(tmp_path, capsys):
    (tmp_path / "a.txt").write_bytes(TEXT)
    out = tmp_path / "c.bin"
    assert main(["prepare", str(tmp_path / "a.txt"), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    tok = ByteTokenizer()
    assert isinstance(TF.open_dataset(out, tok, 16).tokens, np.memmap)
    raw, side = out.read_bytes(), TF.sidecar_of(out).read_text()
    out.write_bytes(raw[:-2])                                              # one token short
    with pytest.raises(DataError, match="sidecar counts"):
        TF.open_dataset(out, tok, 16)
    out.write_bytes(raw)
    TF.sidecar_of(out).unlink()                                            # no sidecar
    with pytest.raises(DataError, match="no sidecar c.bin.json"):
        TF.open_dataset(out, tok, 16)
    TF.sidecar_of(out).write_text(side.replace('"vocab": 256', '"vocab": 70000'))   # ids too wide for uint16
    with pytest.raises(DataError, match="tokens, vocab or dtype"):
        TF.open_dataset(out, tok, 16)
    TF.sidecar_of(out).write_text(side.replace('"vocab": 256', '"vocab": 50257').replace('"byte"', '"gpt2"'))
    with pytest.raises(DataError, match=r"tokenized with gpt2 \(50,257 ids\), but this model reads byte"):
        TF.open_dataset(out, tok, 16)
    TF.sidecar_of(out).write_text(side)
    bad = np.fromfile(out, "<u2").copy()
    bad[:] = 300                                                           # past the byte vocabulary
    bad.tofile(out)
    ds = TF.open_dataset(out, tok, 16)
    with pytest.raises(DataError, match="token id 300, past the vocabulary of 256"):
        ds.sample(np.random.default_rng(0), 4)
    assert main(["train", "--data", str(out), "--preset", "tiny", "--steps", "1", "--out", str(tmp_path / "m.tinygpt")]) == 1
    one_line(capsys, "token id 300")


def test_windows_of_a_token_file_are_the_arrays(tmp_path):
    """The same draws from the memory map as from the text's array: a resumed run (its data-sampling
    state restored) sees the same batches from either."""
    (tmp_path / "a.txt").write_bytes(TEXT)
    out = tmp_path / "c.bin"
    TF.prepare([tmp_path / "a.txt"], out, show_progress=False)
    mapped = TF.open_dataset(out, ByteTokenizer(), 24)
    text = Dataset(ByteTokenizer().encode(TEXT), 24)
    r1, r2 = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(3):
        (x1, y1), (x2, y2) = mapped.sample(r1, 8), text.sample(r2, 8)
        assert x1.dtype == x2.dtype == np.uint32 and np.array_equal(x1, x2) and np.array_equal(y1, y2)
    for a, b in zip(mapped.val_windows(10), text.val_windows(10)):
        assert np.array_equal(a, b)


def test_a_token_file_past_the_text_bound_trains(tmp_path, monkeypatch, capsys):
    """With the text bound forced to 50 KB, the text is refused and its token file (twice that)
    trains, evaluates, and resumes; a directory of text files trains as their concatenation."""
    text = TEXT * 4                                                        # 129,600 bytes
    (tmp_path / "a.txt").write_bytes(text)
    monkeypatch.setattr(D, "max_corpus_bytes", lambda: 50_000)
    monkeypatch.setattr(TF, "max_corpus_bytes", lambda: 50_000)
    m = tmp_path / "m.tinygpt"
    args = ["--preset", "tiny", "--steps", "2", "--sample-tokens", "0", "--eval-every", "0", "--quiet"]
    assert main(["train", "--data", str(tmp_path / "a.txt"), "--out", str(m)] + args) == 1
    one_line(capsys, "more than the 50,000 this can read")
    out = tmp_path / "c.bin"
    assert main(["prepare", str(tmp_path / "a.txt"), "--out", str(out), "--quiet"]) == 0
    assert out.stat().st_size > 2 * 50_000
    assert main(["train", "--data", str(out), "--out", str(m)] + args) == 0
    assert main(["eval", "--model", str(m), "--data", str(out), "--max-windows", "4"]) == 0
    assert main(["train", "--resume", str(m), "--data", str(out), "--steps", "3", "--sample-tokens", "0",
                 "--eval-every", "0", "--quiet"]) == 0
    d = tmp_path / "texts"
    (d / "sub").mkdir(parents=True)
    (d / "1.txt").write_bytes(text[:20_000])
    (d / "sub" / "2.txt").write_bytes(text[20_000:40_000])
    (d / ".hidden").write_bytes(b"\xff" * 10)
    tok = ByteTokenizer()
    assert np.array_equal(TF.open_dataset(d, tok, 16).tokens, tok.encode(text[:40_000]))
    capsys.readouterr()
    assert main(["train", "--data", str(d), "--out", str(tmp_path / "d.tinygpt")] + args) == 0
    (d / "3.txt").write_bytes(text[:20_000])                               # 60 KB in all: over the bound
    with pytest.raises(DataError, match="3 files hold 60,000 bytes"):
        TF.open_dataset(d, tok, 16)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak from Linux's /proc/self/status")
def test_nothing_reads_a_token_file_whole(tmp_path):
    """A 16 GiB token file (sparse: zeros, token 0) trains two steps and evaluates in a process whose
    peak memory stays under a quarter of the file's size. The peak is the process's own (VmHWM of
    its address space), not getrusage's ru_maxrss: Linux carries ru_maxrss across exec from the
    parent, so a child of a pytest grown to 5.8 GB reported 5.8 GB having read nothing."""
    big = tmp_path / "big.bin"
    n = 1 << 33
    with open(big, "wb") as f:
        f.truncate(2 * n)
    split = int(np.floor(0.9 * n))
    TF.sidecar_of(big).write_text(json.dumps({
        "format": TF.FORMAT, "version": TF.VERSION, "writer": "tinygpt", "tokenizer": "byte", "vocab": 256,
        "dtype": "uint16", "tokens": n, "sources": [], "split": {"train": split, "val": n - split}}))
    code = ("from tinygpt.commands.cli import main\n"
            f"rc = main(['train', '--data', {str(big)!r}, '--preset', 'tiny', '--ctx', '8', '--steps', '2', '--eval-every', '1', "
            f"'--sample-tokens', '0', '--quiet', '--out', {str(tmp_path / 'm.tinygpt')!r}])\n"
            "hwm = [l.split() for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
            "print(rc, int(hwm[1]) * 1024)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-2000:]
    rc, peak = map(int, r.stdout.split()[-2:])
    print(f"trained from a {2 * n:,}-byte token file; peak resident memory {peak:,} bytes")
    assert rc == 0 and peak < 2 * n // 4
