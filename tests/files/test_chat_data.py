"""Chat files (issue 65): conversations rendered with the model's chat template and scored on the
assistant's tokens alone. `tinygpt eval` of a chat file against transformers' mean cross-entropy
over the same tokens (apply_chat_template's assistant mask, from a template that marks them), a
LoRA run on one lowering that loss with peft's model of its export agreeing, which tokens are
scored, and (issue 67) hostile lines refused by their number in one line before any step."""
import json
import re

import numpy as np
import pytest

from support import run_cli
from test_hf_llama import reference


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """transformers' random Qwen2 with a marked template, its chat file and loss, imported here."""
    d = tmp_path_factory.mktemp("chat")
    reference("chat", d)
    assert run_cli("import-hf", d / "hf", "--out", d / "m.tinygpt", "--quiet") == 0
    return d


def eval_json(capsys, model, data, *more):
    capsys.readouterr()
    assert run_cli("eval", "--model", model, "--data", data, "--json", "--quiet", *more) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_eval_of_a_chat_file_is_transformers_assistant_loss(chat, capsys):
    ref = np.load(chat / "chat.npz")
    r = eval_json(capsys, chat / "m.tinygpt", chat / "chat.jsonl")
    print(f"tinygpt {r['loss']:.7f} over {r['tokens']} tokens, transformers {float(ref['loss']):.7f} over "
          f"{int(ref['count'])}: difference {abs(r['loss'] - float(ref['loss'])):.2e}")
    assert r["tokens"] == int(ref["count"])
    assert abs(r["loss"] - float(ref["loss"])) < 1e-4


def test_the_scored_tokens_are_each_reply_and_its_end(chat):
    """Each assistant turn's content and the <|im_end|> after it; never a header, a user's turn or
    the newline after the end; a prompt and completion of strings are a user turn and its reply."""
    from tinygpt import GPT
    from tinygpt.files.chat_data import conversation_of, encode_conversation
    from tinygpt.run.infer import stop_ids
    from tinygpt.tokenizers.chat import template_of
    gpt = GPT.load(chat / "m.tinygpt")
    tok, extra = gpt.tokenizer, gpt.checkpoint.extra
    stop = stop_ids(extra, tok, gpt.checkpoint.cfg.vocab)
    lines = (chat / "chat.jsonl").read_text().splitlines()
    for n, want in ((1, ["or not to be, that is the question<|im_end|>"]), (2, ["in the mind to suffer<|im_end|>"]),
                    (4, ["that is<|im_end|>", "whether 'tis<|im_end|>"])):
        ids, scored = encode_conversation(conversation_of(json.loads(lines[n - 1]), f"line {n}"),
                                          template_of(extra, tok), tok, stop, f"line {n}")
        runs = np.split(np.arange(len(ids)), np.flatnonzero(np.diff(scored.astype(int))) + 1)
        got = [tok.decode(ids[r]) for r in runs if scored[r[0]]]
        print(f"line {n}: {got}")
        assert got == want
        assert tok.decode(ids) == template_of(extra, tok).render(conversation_of(json.loads(lines[n - 1]), ""),
                                                                 add_generation_prompt=False)


def test_a_lora_run_on_a_chat_file_lowers_its_loss_and_peft_agrees(chat, capsys, tmp_path):
    before = eval_json(capsys, chat / "m.tinygpt", chat / "chat.jsonl")["loss"]
    out = tmp_path / "lora.tinygpt"
    assert run_cli("train", "--resume", chat / "m.tinygpt", "--lora", 4, "--data", chat / "chat.jsonl",
                   "--val-data", chat / "chat.jsonl", "--steps", 12, "--lr", 3e-3, "--batch", 4, "--out", out,
                   "--quiet", "--sample-tokens", 0) == 0
    assert "5 conversations to train on" in capsys.readouterr().err
    after = eval_json(capsys, out, chat / "chat.jsonl")["loss"]
    assert run_cli("export", "--model", out, "--format", "peft", tmp_path / "peft", "--quiet") == 0
    reference("chatloss", chat, tmp_path / "peft")
    peft = float(np.load(tmp_path / "peft" / "chatloss.npz")["loss"])
    print(f"the chat file's loss {before:.5f} -> {after:.5f}; peft's model of the export {peft:.7f} "
          f"(difference {abs(peft - after):.2e})")
    assert after < before - 0.05
    assert abs(peft - after) < 1e-4


# ---- hostile lines ---------------------------------------------------------------------------
def _turn(role, content):
    return {"role": role, "content": content}


GOOD = {"messages": [_turn("user", "hi"), _turn("assistant", "hello")]}
HOSTILE = {         # name: (the bad line's text, what the one-line refusal says)
    "not JSON": ('{"messages": [', "not JSON"),
    "a list, not an object": ("[1, 2]", "a JSON object"),
    "no messages nor prompt": ('{"text": "hi"}', "no \"messages\""),
    "messages a string": ('{"messages": "hi"}', "a list of"),
    "no messages at all": ('{"messages": []}', "a list of"),
    "an unknown role": (json.dumps({"messages": [_turn("wizard", "x"), _turn("assistant", "y")]}), "role 'wizard'"),
    "content a number": (json.dumps({"messages": [_turn("user", 5), _turn("assistant", "y")]}), "string content"),
    "a message not an object": (json.dumps({"messages": ["hi", _turn("assistant", "y")]}), "a message is a dict"),
    "no assistant turn": (json.dumps({"messages": [_turn("user", "hi")]}), "no assistant turn"),
    "an empty assistant turn": (json.dumps({"messages": [_turn("user", "hi"), _turn("assistant", " \n")]}),
                                "is empty"),
    "the assistant first": (json.dumps({"messages": [_turn("assistant", "hi"), _turn("user", "x")]}),
                            "opens with the assistant"),
    "a completion not text": (json.dumps({"prompt": "a", "completion": 5}), "a string or a list"),
    "a prompt alone": (json.dumps({"prompt": "a"}), "no \"messages\""),
    "longer than the window": (json.dumps({"messages": [_turn("user", "x" * 300), _turn("assistant", "y")]}),
                               "more than the window"),
    "not UTF-8": (b'{"messages": "\xff\xfe"}', "not UTF-8"),
    "nested past the parser": ("[" * 100_000, "not JSON"),
    "a role of another type": (json.dumps({"messages": [{"role": 1, "content": "x"}, _turn("assistant", "y")]}),
                               "string role"),
    "too many messages": (json.dumps({"messages": [_turn("user", "x")] * 10_001}), "more than 10,000"),
}


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
    from tinygpt import GPT
    path = tmp_path_factory.mktemp("chat_byte") / "m.tinygpt"
    GPT.from_preset("tiny", ctx=128).save(path)
    return path


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_line_is_refused_by_its_number(byte_model, tmp_path, capsys, case):
    """A good record, a blank line, then the bad one: refused as line 3 in one line, exit 1, by
    eval and by train (before any step)."""
    text, says = HOSTILE[case]
    f = tmp_path / "chat.jsonl"
    f.write_bytes(json.dumps(GOOD).encode() + b"\n\n" + (text if isinstance(text, bytes) else text.encode()) + b"\n")
    for cmd in (["eval", "--model", byte_model, "--data", f],
                ["train", "--resume", byte_model, "--data", f, "--steps", 1, "--out", tmp_path / "o.tinygpt"]):
        capsys.readouterr()
        assert run_cli(*cmd) == 1
        err = capsys.readouterr().err.strip()
        print(f"{case}: {err[:150]}")
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert "--data " in err and "line 3" in err and says in err, err
    assert not (tmp_path / "o.tinygpt").exists()


def test_a_line_of_more_than_16_mib_is_refused_unread(byte_model, tmp_path, capsys):
    f = tmp_path / "chat.jsonl"
    with open(f, "wb") as out:
        out.write(json.dumps(GOOD).encode() + b"\n" + b'{"messages": "' + b"x" * (17 << 20) + b'"}\n')
    assert run_cli("eval", "--model", byte_model, "--data", f) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "line 2 is longer than 16 MiB" in err, err


def test_truncate_cuts_a_long_record_and_refuses_one_with_nothing_left(byte_model, tmp_path, capsys):
    """--truncate keeps a long record's first window when an assistant token is in it; a record
    whose reply starts past the window is still refused by its line."""
    f = tmp_path / "chat.jsonl"
    long_reply = {"messages": [_turn("user", "hi"), _turn("assistant", "y" * 300)]}
    f.write_text(json.dumps(GOOD) + "\n" + json.dumps(long_reply) + "\n")
    r = eval_json(capsys, byte_model, f, "--truncate")
    assert r["windows"] == 2 and r["ctx"] == 128
    late = {"messages": [_turn("user", "x" * 300), _turn("assistant", "y")]}
    f.write_text(json.dumps(GOOD) + "\n" + json.dumps(late) + "\n")
    assert run_cli("eval", "--model", byte_model, "--data", f, "--truncate") == 1
    assert "line 2: its assistant turns begin past the window" in capsys.readouterr().err


def test_a_chat_run_holds_back_its_last_records(byte_model, tmp_path, capsys):
    """No --val-data: the last 5 % of the records (at least one) validate, said in the banner; a
    chat run's steps mean over the assistant's tokens, and --val-data is refused beside a text."""
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"{a} plus {a}?", "completion": f"{2 * a}."}) + "\n"
                         for a in range(40)))
    out = tmp_path / "o.tinygpt"
    assert run_cli("train", "--resume", byte_model, "--data", f, "--steps", 3, "--out", out, "--batch", 4,
                   "--sample-tokens", 0, "--quiet") == 0
    err = capsys.readouterr().err
    assert "38 conversations to train on, 2 held for validation (the file's last 2)" in err, err
    text = tmp_path / "t.txt"
    text.write_text("some text " * 500)
    assert run_cli("train", "--resume", byte_model, "--data", text, "--val-data", f, "--steps", 1,
                   "--out", out, "--force") == 2
    assert "--val-data is for a chat file's records" in capsys.readouterr().err


def test_packing_is_best_fit_longest_first_in_log_time():
    """pack's tree finds what a search of every window finds (the fullest window a record fits, the
    longest records first), for random lengths and windows of 1 to 70 rows, records of one row and
    of a whole window among them; every record in exactly one window, none over its end."""
    from tinygpt.files.chat_data import ChatRecord, pack
    r = np.random.default_rng(7)

    def searched(lengths, T):
        rooms, bins = [], []
        for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
            fits = [j for j, room in enumerate(rooms) if room >= lengths[i]]
            if not fits:
                bins.append([i])
                rooms.append(T - lengths[i])
                continue
            j = min(fits, key=lambda j: (rooms[j], j))
            bins[j].append(i)
            rooms[j] -= lengths[i]
        return bins
    for _ in range(200):
        T = int(r.integers(1, 71))
        lengths = [int(n) for n in r.integers(1, T + 1, int(r.integers(1, 60)))]
        records = [ChatRecord(i, np.zeros(n + 1, np.uint32), np.zeros(n + 1, bool)) for i, n in enumerate(lengths)]
        bins = pack(records, T)
        assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in b) <= T for b in bins)
        fills = lambda bs: sorted(sum(lengths[i] for i in b) for b in bs)    # which of two windows of the same
        assert fills(bins) == fills(searched(lengths, T)), (T, lengths)     # room takes a record: either


def test_records_are_packed_several_to_a_window(tmp_path, capsys, monkeypatch):
    """A chat file's records are packed end to end, several to a window (each fills its length less
    one; the window is the longest record's power of two): every record exactly once, none across a
    window's end, each one's positions restarting at 0, its scored targets its own, the padding
    unscored. The banner gives the windows and the fill; eval of the file, packed, equals the mean
    over the records scored one window each (the attention stays within a record)."""
    from tinygpt.core.config import UNSCORED
    from tinygpt.files.chat_data import ChatRecord, pack, packed_windows
    r = np.random.default_rng(3)
    records = [ChatRecord(i, np.arange(n + 1, dtype=np.uint32) + i, r.random(n + 1) < 0.5)
               for i, n in enumerate([30, 1, 17, 9, 32, 5, 12, 3, 28, 2])]
    bins = pack(records, 32)
    assert sorted(i for b in bins for i in b) == list(range(10))
    assert all(sum(len(records[i].ids) - 1 for i in b) <= 32 for b in bins)
    assert len(bins) == 5, bins                   # 139 rows in windows of 32: as few as the lengths allow
    x, y, refs, docs = packed_windows(records, bins, 32)
    assert refs is None and x.shape == y.shape == docs.shape == (5, 32)
    for w, b in enumerate(bins):
        t = 0
        for i in b:
            rec, n = records[i], len(records[i].ids) - 1
            assert (docs[w, t:t + n] == np.arange(n)).all() and (x[w, t:t + n] == rec.ids[:-1]).all()
            assert (y[w, t:t + n] == np.where(rec.scored[1:], rec.ids[1:], UNSCORED)).all()
            t += n
        assert (y[w, t:] == UNSCORED).all() and (docs[w, t:] == np.arange(32 - t)).all()
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"{a} plus {a}?", "completion": f"{2 * a}." * (1 + a % 3)}) + "\n"
                         for a in range(40)))
    from tinygpt import GPT
    from tinygpt.run import infer
    model, out = tmp_path / "m.tinygpt", tmp_path / "o.tinygpt"
    GPT.from_preset("tiny", ctx=512).save(model)
    assert run_cli("train", "--resume", model, "--data", f, "--steps", 2, "--out", out, "--batch", 4,
                   "--ctx", 512, "--sample-tokens", 0, "--quiet") == 0
    err = capsys.readouterr().err
    banner = next(line for line in err.splitlines() if "conversations to train on" in line)
    print(banner)
    n, T, fill = (int(v) for v in re.search(r"packed into (\d+) windows of (\d+), (\d+)% filled", banner).groups())
    assert T == 512 and n < 10 and fill > 60, banner    # a window each: 38 windows, about 15% filled
    packed = eval_json(capsys, out, f, "--ctx", 512)
    monkeypatch.setattr(infer, "pack", lambda records, T: [[i] for i in range(len(records))])
    one_each = eval_json(capsys, out, f, "--ctx", 512)
    print(f"eval packed {packed['loss']:.7f} over {packed['windows']} windows; one record a window "
          f"{one_each['loss']:.7f} over {one_each['windows']}")
    assert one_each["windows"] == 40 and packed["windows"] < 10 and packed["tokens"] == one_each["tokens"]
    assert abs(packed["loss"] - one_each["loss"]) < 1e-5


# ---- preference pairs (DPO) ------------------------------------------------------------------
def test_a_lora_dpo_run_starts_at_ln2_falls_and_eval_agrees_with_peft(chat, capsys, tmp_path):
    """The run's first step is at ln 2 (the adapters at zero: the model is its reference) and its
    loss falls; eval's DPO loss, reward accuracy and margin equal torch's from peft's model of the
    export against the base, within 1e-4."""
    import json as _json
    out, log = tmp_path / "dpo.tinygpt", tmp_path / "log.jsonl"
    assert run_cli("train", "--resume", chat / "m.tinygpt", "--lora", 4, "--data", chat / "pref.jsonl",
                   "--val-data", chat / "pref.jsonl", "--steps", 12, "--lr", 1e-2, "--batch", 4, "--out", out,
                   "--log-every", 1, "--eval-every", 12, "--log", log, "--quiet", "--sample-tokens", 0) == 0
    err = capsys.readouterr().err
    assert "dpo: beta 0.1, the reference: the base (its adapters at zero)" in err
    rows = [r for r in map(_json.loads, log.read_text().splitlines()) if "train_loss" in r]
    run = (f"DPO losses {rows[0]['train_loss']:.6f} -> {rows[-1]['train_loss']:.4f}; "
           f"val accuracy {rows[-1]['val_reward_accuracy']}, margin {rows[-1]['val_reward_margin']:+.4f}")
    assert abs(rows[0]["train_loss"] - np.log(2)) < 1e-6, run
    assert rows[-1]["train_loss"] < np.log(2) - 0.05
    r = eval_json(capsys, out, chat / "pref.jsonl")
    assert run_cli("export", "--model", out, "--format", "peft", tmp_path / "peft", "--quiet") == 0
    reference("chatloss", chat, tmp_path / "peft")
    ref = np.load(tmp_path / "peft" / "chatloss.npz")
    print(run)
    print(f"eval's DPO loss {r['loss']:.7f}, torch with peft's model {float(ref['dpo']):.7f}; accuracy "
          f"{r['reward_accuracy']} / {float(ref['accuracy'])}, margin {r['reward_margin']:.6f} / {float(ref['margin']):.6f}")
    assert abs(r["loss"] - float(ref["dpo"])) < 1e-4 and abs(r["reward_margin"] - float(ref["margin"])) < 1e-4
    assert r["reward_accuracy"] == float(ref["accuracy"]) and r["pairs"] == 6


PAIR = {"prompt": "hi", "chosen": "hello", "rejected": "go away"}
HOSTILE_PAIRS = {
    "the same completion twice": (dict(PAIR, rejected="hello"), "chosen and rejected are the same"),
    "no rejected": ({"prompt": "hi", "chosen": "hello"}, "a preference record is"),
    "a conversation among pairs": (GOOD, "a preference record is"),
    "a completion of the user": (dict(PAIR, chosen=[_turn("user", "x")]), "chosen: no assistant turn"),
    "an empty completion": (dict(PAIR, rejected=""), "is empty"),
    "a prompt of a number": (dict(PAIR, prompt=3), "prompt: a string or a list"),
}


@pytest.mark.parametrize("case", list(HOSTILE_PAIRS))
def test_a_hostile_preference_line_is_refused_by_its_number(byte_model, tmp_path, capsys, case):
    record, says = HOSTILE_PAIRS[case]
    f = tmp_path / "pref.jsonl"
    f.write_text(json.dumps(PAIR) + "\n" + json.dumps(record) + "\n")
    assert run_cli("train", "--resume", byte_model, "--data", f, "--steps", 1, "--batch", 2,
                   "--out", tmp_path / "o.tinygpt") == 1
    err = capsys.readouterr().err.strip()
    print(f"{case}: {err[:160]}")
    assert len(err.splitlines()) == 1 and "line 2" in err and says in err, err
    assert not (tmp_path / "o.tinygpt").exists()


def test_dpo_options_need_a_preference_file(byte_model, tmp_path, capsys):
    f = tmp_path / "chat.jsonl"
    f.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
    assert run_cli("train", "--resume", byte_model, "--data", f, "--dpo-beta", 0.2, "--steps", 1,
                   "--out", tmp_path / "o.tinygpt") == 2
    assert "--dpo-beta is for a preference file's run" in capsys.readouterr().err
    p = tmp_path / "pref.jsonl"
    p.write_text(json.dumps(PAIR) + "\n" + json.dumps(PAIR) + "\n")
    assert run_cli("train", "--resume", byte_model, "--data", p, "--batch", 3, "--steps", 1,
                   "--out", tmp_path / "o.tinygpt") == 2
    assert "give an even batch" in capsys.readouterr().err


def test_a_full_dpo_run_against_a_reference_file(byte_model, tmp_path, capsys):
    """A full fine-tune by DPO: --reference FILE's weights give the reference's log-probabilities
    (swapped into the run's model for that pass, then the run's own put back), so a run from the
    same weights starts at ln 2; eval with the same --reference reports the run's own loss; the
    run resumed on the same data scores against the log-probabilities its file kept."""
    import json as _json
    pairs = tmp_path / "pref.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"{a} and {a}?", "chosen": f"{2 * a}.",
                                         "rejected": f"{a}{a}{a}, or so."}) + "\n" for a in range(8)))
    out, log = tmp_path / "dpo.tinygpt", tmp_path / "log.jsonl"
    assert run_cli("train", "--resume", byte_model, "--data", pairs, "--val-data", pairs, "--reference", byte_model,
                   "--steps", 4, "--batch", 4, "--lr", 1e-3, "--log-every", 1, "--eval-every", 4, "--log", log,
                   "--out", out, "--quiet", "--sample-tokens", 0) == 0
    assert f"the reference: {byte_model}" in capsys.readouterr().err
    rows = [r for r in map(_json.loads, log.read_text().splitlines()) if "train_loss" in r]
    r = eval_json(capsys, out, pairs, "--reference", byte_model)
    assert run_cli("eval", "--model", out, "--data", pairs) == 2
    assert "holds no LoRA adapters, so no base" in capsys.readouterr().err
    assert run_cli("train", "--resume", out, "--data", pairs, "--val-data", pairs, "--steps", 6, "--batch", 4,
                   "--quiet", "--sample-tokens", 0) == 0        # resumed: the file's kept log-probabilities
    assert "the reference: the log-probabilities the resumed file kept" in capsys.readouterr().err
    print(f"full DPO: {rows[0]['train_loss']:.6f} -> {rows[-1]['train_loss']:.4f}; eval {r['loss']:.6f} against the "
          f"run's last validation {rows[-1]['val_loss']:.6f}")
    assert abs(rows[0]["train_loss"] - np.log(2)) < 1e-6
    assert abs(r["loss"] - rows[-1]["val_loss"]) < 1e-5 and r["pairs"] == 8
