"""Chat files: conversations as the ecosystem writes them, one JSON record a line, rendered with
the model's chat template and scored on the assistant's tokens alone.

A record is either
    {"messages": [{"role": ..., "content": ...}, ...]}    a conversation (system, user, assistant turns)
    {"prompt": P, "completion": C}                        P and C strings (a user turn and the reply to
                                                           it) or message lists (trl's conversational form)
or, in a preference file (DPO's, as trl takes it), a pair of completions to one prompt:
    {"prompt": P, "chosen": C, "rejected": R}             strings or message lists, as above; what is
                                                           scored is each completion's assistant turns
What is scored (trl's assistant-only loss, axolotl's train_on_inputs: false): each assistant turn's
content and the token that ends its turn (the first of the model's stop tokens after the content),
never its role header, never another turn. The template is rendered for the conversation up to each
assistant turn with the generation prompt and for the conversation through it: the text between the
two is the turn's, and each piece of text is encoded on its own, as the model sees a reply at chat
time (the prompt encoded, then the reply's tokens after it). A template that does not render a
conversation as the sum of its turns (one that rewrites earlier turns) is refused on the record.

Every line is checked before the first step, and a bad one is refused by its number with what is
wrong; nothing is dropped silently. A record of more tokens than the window is refused, or cut to
it with the truncate option (a cut that leaves no assistant token is still refused).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np

from ..core.config import UNSCORED
from ..core.errors import UsageError
from ..core.fs import available_memory, check_regular
from ..tokenizers.chat import ROLES, TemplateError, check_messages
from .data import DataError

MAX_LINE = 16 << 20              # bytes of one record (a real conversation's are far fewer)
MAX_RECORDS = 10_000_000
VAL_SHARE = 0.05                 # the records held back for validation where no file is given
CHAT_SUFFIX = ".jsonl"


def is_chat_file(path) -> bool:
    """A data path ending .jsonl is a chat file (a text or token file is anything else)."""
    return path is not None and str(path).lower().endswith(CHAT_SUFFIX) and not os.path.isdir(path)


@dataclass(frozen=True)
class ChatRecord:
    line: int                    # its line in the file, 1 first
    ids: np.ndarray              # uint32 [n]: the rendered conversation's tokens
    scored: np.ndarray           # bool [n]: the token is a target that is scored (an assistant's)


def _turns(value, role: str, label: str) -> list:
    """A prompt's or completion's messages: a string is one turn of `role`, a list is messages."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list):
        return list(value)
    raise DataError(f"{label}: a string or a list of messages, got {type(value).__name__}")


def conversation_of(record, label: str) -> list[dict]:
    """The messages of one record, every turn checked (role, string content, an assistant turn
    with content), or DataError naming the line."""
    if not isinstance(record, dict):
        raise DataError(f"{label}: a record is a JSON object with \"messages\", or \"prompt\" and \"completion\"; "
                        f"got {type(record).__name__}")
    if "messages" in record:
        messages = record["messages"]
    elif "prompt" in record and "completion" in record:
        messages = _turns(record["prompt"], "user", f"{label}: prompt") + \
            _turns(record["completion"], "assistant", f"{label}: completion")
    else:
        raise DataError(f"{label}: no \"messages\", nor \"prompt\" and \"completion\"; a record is "
                        f"{{\"messages\": [{{\"role\": ..., \"content\": ...}}, ...]}} or "
                        f"{{\"prompt\": ..., \"completion\": ...}}")
    try:
        messages = check_messages(messages, f"{label}: messages")
    except UsageError as e:
        raise DataError(e.text) from None
    replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not replies:
        raise DataError(f"{label}: no assistant turn, so nothing to learn from it; give each record a reply "
                        f"(roles: {', '.join(ROLES)})")
    for i in replies:
        if not messages[i]["content"].strip():
            raise DataError(f"{label}: messages[{i}], an assistant turn, is empty; remove the record or give it "
                            "the reply")
    if replies[0] == 0:
        raise DataError(f"{label}: the conversation opens with the assistant; an assistant turn answers a turn "
                        "before it")
    return messages


def encode_conversation(messages, template, tok, stop: tuple, label: str,
                        first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ids, scored) of one conversation: the template's text cut at each assistant turn's bounds
    (those from messages[first] on: a preference pair's completion), each piece encoded on its own;
    in a turn, its tokens up to and with the first stop token scored."""
    try:
        full = template.render(messages, add_generation_prompt=False)
        bounds, at = [], 0
        for i, m in enumerate(messages):
            if m["role"] != "assistant" or i < first:
                continue
            before = template.render(messages[:i], add_generation_prompt=True)
            through = template.render(messages[:i + 1], add_generation_prompt=False)
            if not (through.startswith(before) and full.startswith(through) and len(before) >= at):
                raise DataError(f"{label}: the chat template does not render this conversation turn by turn (it "
                                f"rewrites what comes before messages[{i}]), so its assistant tokens cannot be told")
            bounds.append((len(before), len(through)))
            at = len(through)
    except TemplateError as e:
        raise DataError(f"{label}: {e.text}") from None
    ids, scored, at = [], [], 0
    stops = set(stop)
    for a, b in bounds:
        head = [int(i) for i in tok.encode(full[at:a])] if a > at else []
        turn = [int(i) for i in tok.encode(full[a:b])]
        end = next((k + 1 for k, t in enumerate(turn) if t in stops), len(turn))
        ids += head + turn
        scored += [False] * len(head) + [True] * end + [False] * (len(turn) - end)
        at = b
    tail = [int(i) for i in tok.encode(full[at:])] if at < len(full) else []
    ids += tail
    scored += [False] * len(tail)
    return np.asarray(ids, np.uint32), np.asarray(scored, bool)


def _lines(path, label: str):
    """(number, text) of each non-blank line, each read with its length bounded first."""
    st = check_regular(path, DataError, label, "a JSON Lines file of conversations")
    if st.st_size > available_memory() // 4:
        raise DataError(f"{label}: {st.st_size:,} bytes, more than a quarter of free memory; split the file")
    with open(path, "rb") as f:
        for n in range(1, MAX_RECORDS + 2):
            raw = f.readline(MAX_LINE + 1)
            if not raw:
                return
            if n > MAX_RECORDS:
                raise DataError(f"{label}: more than {MAX_RECORDS:,} lines; split the file")
            if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
                raise DataError(f"{label}: line {n} is longer than {MAX_LINE >> 20} MiB; a record is one "
                                "conversation a line")
            if raw.strip():
                try:
                    yield n, raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(f"{label}: line {n} is not UTF-8 (byte {e.start}); save the file as "
                                    "UTF-8") from None


def read_chat_file(path, template, tok, stop: tuple, window: int, truncate: bool = False,
                   label: str | None = None) -> list[ChatRecord]:
    """Every record of a chat file encoded, in order, each fitting `window` targets (ids of
    window + 1), or DataError naming the first bad line."""
    label = label or f"{{opt:data}} {path}"
    records = []
    for n, text in _lines(path, label):
        where = f"{label}: line {n}"
        try:
            record = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise DataError(f"{where}: not JSON ({str(e)[:80]}); a record is one JSON object a line") from None
        if isinstance(record, dict) and "chosen" in record:
            raise DataError(f"{where}: a preference pair among conversations; a file holds one kind of record")
        ids, scored = encode_conversation(conversation_of(record, where), template, tok, stop, where)
        records.append(_fitted(n, ids, scored, window, truncate, where))
    if not records:
        raise DataError(f"{label}: holds no record; give one conversation a line")
    return records


def is_preference_file(path) -> bool:
    """A chat file whose first record is a preference pair (prompt, chosen, rejected)."""
    if not is_chat_file(path) or not os.path.isfile(path):
        return False
    for _, text in _lines(path, f"{{opt:data}} {path}"):
        try:
            first = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            return False
        return isinstance(first, dict) and "chosen" in first and "rejected" in first
    return False


@dataclass(frozen=True)
class Pair:
    line: int
    chosen: ChatRecord
    rejected: ChatRecord


def pair_of(record, label: str) -> tuple[list, list, int]:
    """(the prompt and chosen completion, the prompt and rejected one, the prompt's messages) of a
    preference record, each checked as a conversation; the same completion twice is refused."""
    if not isinstance(record, dict) or not all(k in record for k in ("prompt", "chosen", "rejected")):
        raise DataError(f"{label}: a preference record is {{\"prompt\": ..., \"chosen\": ..., \"rejected\": ...}}; "
                        f"got {str(record)[:80]}")
    prompt = _turns(record["prompt"], "user", f"{label}: prompt")
    sides = [prompt + _turns(record[k], "assistant", f"{label}: {k}") for k in ("chosen", "rejected")]
    for k, messages in zip(("chosen", "rejected"), sides):
        conversation_of({"messages": messages}, f"{label}: {k}")
        if not any(m.get("role") == "assistant" for m in messages[len(prompt):]):
            raise DataError(f"{label}: {k} holds no assistant turn; a completion is the assistant's reply")
    if sides[0] == sides[1]:
        raise DataError(f"{label}: chosen and rejected are the same; a pair prefers one completion to another")
    return sides[0], sides[1], len(prompt)


def read_preference_file(path, template, tok, stop: tuple, window: int, truncate: bool = False,
                         label: str | None = None) -> list[Pair]:
    """Every pair of a preference file encoded, each completion a window's record (as
    read_chat_file's), or DataError naming the first bad line."""
    label = label or f"{{opt:data}} {path}"
    pairs = []
    for n, text in _lines(path, label):
        where = f"{label}: line {n}"
        try:
            record = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise DataError(f"{where}: not JSON ({str(e)[:80]}); a record is one JSON object a line") from None
        chosen, rejected, first = pair_of(record, where)
        sides = [_fitted(n, *encode_conversation(m, template, tok, stop, where, first), window, truncate, where)
                 for m in (chosen, rejected)]
        pairs.append(Pair(n, *sides))
    if not pairs:
        raise DataError(f"{label}: holds no record; give one preference pair a line")
    return pairs


def _fitted(n: int, ids, scored, window: int, truncate: bool, where: str) -> ChatRecord:
    """A record of at most window + 1 ids (cut with truncate), with a scored target left."""
    if len(ids) > window + 1:
        if not truncate:
            raise DataError(f"{where}: {len(ids):,} tokens, more than the window of {window:,} (+1); cut it "
                            "with {opt:truncate}, or give a longer {opt:ctx}")
        ids, scored = ids[:window + 1], scored[:window + 1]
    if not scored[1:].any():
        raise DataError(f"{where}: its assistant turns begin past the window of {window:,} tokens; shorten the "
                        "record or give a longer {opt:ctx}")
    return ChatRecord(n, ids, scored)


def reply_prompt(record: ChatRecord) -> list[int]:
    """A record's tokens before its last reply: the conversation up to and with the assistant's
    header, which a model answers as the record's last assistant turn."""
    starts = np.flatnonzero(record.scored & ~np.concatenate([[False], record.scored[:-1]]))
    return [int(i) for i in record.ids[:starts[-1]]]


def windows(records: list[ChatRecord], T: int) -> tuple[np.ndarray, np.ndarray]:
    """One record a window of T: x its tokens, y the next ones where scored (UNSCORED elsewhere);
    the tail padded with token 0, whose targets are not scored (causal attention: the padding
    after a record does not reach it)."""
    x = np.zeros((len(records), T), np.uint32)
    y = np.full((len(records), T), UNSCORED, np.uint32)
    for r, rec in enumerate(records):
        n = len(rec.ids) - 1
        x[r, :n] = rec.ids[:-1]
        y[r, :n] = np.where(rec.scored[1:], rec.ids[1:], UNSCORED)
    return x, y


def pack(records: list[ChatRecord], T: int) -> list[list[int]]:
    """The records' indices grouped into windows of T tokens, each window's records laid end to end
    (best fit, longest first: each record into the fullest window it fits, else a new one; a few
    windows, each as full as the lengths allow; deterministic). A record fills len(ids) - 1 rows
    (its last token is only a target). O(records log T): the windows are kept by the room they
    have left, and a tree over the T + 1 room values finds the least room a record fits."""
    order = sorted(range(len(records)), key=lambda i: (-(len(records[i].ids) - 1), i))
    rooms = _Rooms(T)
    by_room = [[] for _ in range(T + 1)]         # the windows (their indices) with each room left
    bins = []
    for i in order:
        n = len(records[i].ids) - 1
        assert 1 <= n <= T, (n, T)
        r = rooms.least_from(n)
        if r is None:                            # no window has room: a new one
            bins.append([])
            j, r = len(bins) - 1, T
        else:
            j = by_room[r].pop()
            if not by_room[r]:
                rooms.mark(r, False)
        bins[j].append(i)
        if not by_room[r - n]:
            rooms.mark(r - n, True)
        by_room[r - n].append(j)
    return bins


class _Rooms:
    """The room values 0..T that some window has left, as the leaves of a tree whose every node
    says whether a leaf under it is marked."""

    def __init__(self, T: int):
        self.size = 1 << T.bit_length()
        self.have = [False] * (2 * self.size)

    def mark(self, r: int, on: bool):
        node = self.size + r
        self.have[node] = on
        while node > 1:
            node //= 2
            self.have[node] = self.have[2 * node] or self.have[2 * node + 1]

    def least_from(self, n: int) -> int | None:
        """The least marked value >= n, or None: up from leaf n to the first right sibling that
        holds a mark, then down its leftmost marked path."""
        have, node = self.have, self.size + n
        if have[node]:
            return n
        while node > 1:
            if node % 2 == 0 and have[node + 1]:
                node += 1
                break
            node //= 2
        else:
            return None
        while node < self.size:
            node = 2 * node if have[2 * node] else 2 * node + 1
        return node - self.size


def packed_windows(records: list[ChatRecord], bins: list[list[int]], T: int):
    """Each bin's records laid end to end in a window of T -> (x, y, None, docs) [len(bins), T]: y the
    next tokens where scored (UNSCORED elsewhere: prompts, headers, the padding after the last
    record), docs each row's position in its record, which the model's attention and positions
    read (each record attends within itself; its positions restart at 0). The padding is a record
    of its own, attended by nothing. None: no preference pairs' reference (the batch's place)."""
    x = np.zeros((len(bins), T), np.uint32)
    y = np.full((len(bins), T), UNSCORED, np.uint32)
    docs = np.zeros((len(bins), T), np.uint32)
    for w, members in enumerate(bins):
        t = 0
        for i in members:
            rec = records[i]
            n = len(rec.ids) - 1
            x[w, t:t + n] = rec.ids[:-1]
            y[w, t:t + n] = np.where(rec.scored[1:], rec.ids[1:], UNSCORED)
            docs[w, t:t + n] = np.arange(n)
            t += n
        docs[w, t:] = np.arange(T - t)
    return x, y, None, docs


class ChatData:
    """A chat file's records for a run: those trained on and those held back for validation (the
    given validation file's, or the last 5 % of the file's), packed several to a window of T (T is
    set by the run before the first batch: the windows are packed for it, once)."""

    def __init__(self, train: list[ChatRecord], val: list[ChatRecord], T: int, name: str, held: str):
        self.train, self.val, self.T, self.name, self.held = train, val, T, name, held
        self.vocab = None
        self._packed = {}

    def bins(self, which: str) -> list[list[int]]:
        """The windows of the train or val records at the run's window T (packed once per T)."""
        key = (which, self.T)
        if key not in self._packed:
            self._packed[key] = pack(getattr(self, which), self.T)
        return self._packed[key]

    def reply_prompt(self) -> list[int]:
        """What the end of a run answers: the first held-back conversation before its last reply."""
        return reply_prompt(self.val[0])

    def longest(self) -> int:
        """The most tokens a window of this data holds (its longest record's, less the last)."""
        return max(len(r.ids) - 1 for r in self.train + self.val)

    def sample(self, rng: np.random.Generator, B: int):
        """B packed windows drawn at random -> (x [B, T], y [B, T], None, docs [B, T])."""
        bins = self.bins("train")
        return packed_windows(self.train, [bins[i] for i in rng.integers(0, len(bins), B)], self.T)

    def val_windows(self, max_windows: int | None = None):
        bins = self.bins("val")
        return packed_windows(self.val, bins[:max_windows] if max_windows else bins, self.T)

    def describe(self) -> str:
        tokens = sum(len(r.ids) - 1 for r in self.train)
        scored = sum(int(r.scored[1:].sum()) for r in self.train)
        n = len(self.bins("train"))
        return (f"data: {self.name}: {len(self.train):,} conversations to train on, {len(self.val):,} held for "
                f"validation ({self.held}); {scored:,} of their {tokens:,} tokens scored (the assistant's); packed "
                f"into {n:,} windows of {self.T:,}, {tokens / (n * self.T):.0%} filled")


def chat_dataset(path, template, tok, stop: tuple, T: int, truncate: bool = False, val_path=None) -> ChatData:
    """A run's chat data: the file's records, validated on val_path's or on its last 5 %."""
    records = read_chat_file(path, template, tok, stop, T, truncate)
    if val_path is not None:
        val = read_chat_file(val_path, template, tok, stop, T, truncate, f"{{opt:val_data}} {val_path}")
        return ChatData(records, val, T, str(path), f"the file {val_path}")
    if len(records) < 2:
        raise DataError(f"{{opt:data}} {path}: one record; give at least two (the last 5 % are held back for "
                        "validation) or a validation file with {opt:val_data}")
    k = max(1, int(round(len(records) * VAL_SHARE)))
    return ChatData(records[:-k], records[-k:], T, str(path), f"the file's last {k:,}")


def pair_windows(pairs: list[Pair], T: int) -> tuple[np.ndarray, np.ndarray]:
    """Each pair's chosen and rejected completions as windows 2i and 2i+1."""
    return windows([r for p in pairs for r in (p.chosen, p.rejected)], T)


class PreferenceData:
    """A preference file's pairs for a DPO run: those trained on and those held back, each pair two
    windows of one batch (chosen, rejected), with the reference model's log-probability of each
    window, set once before the first step (set_reference) and kept in the run's file."""

    def __init__(self, train: list[Pair], val: list[Pair], T: int, name: str, held: str, digest: str):
        self.train, self.val, self.T, self.name, self.held, self.digest = train, val, T, name, held, digest
        self.refs = None                 # {"train": [2 n], "val": [2 m]}: the reference's log-probabilities

    def longest(self) -> int:
        return max(len(r.ids) - 1 for p in self.train + self.val for r in (p.chosen, p.rejected))

    def reply_prompt(self) -> list[int]:
        return reply_prompt(self.val[0].chosen)

    def set_reference(self, logprobs):
        """logprobs(x, y) -> each window's log-probability under the reference."""
        self.refs = {k: np.asarray(logprobs(*pair_windows(pairs, self.T)), np.float64)
                     for k, pairs in (("train", self.train), ("val", self.val))}

    def reference_record(self) -> dict:
        return {"digest": self.digest, "window": self.T, **{k: v.tolist() for k, v in self.refs.items()}}

    def reference_from(self, record) -> bool:
        """The log-probabilities a run's file kept for this data and window, where it kept them."""
        if not isinstance(record, dict) or record.get("digest") != self.digest or record.get("window") != self.T:
            return False
        got = {k: np.asarray(record.get(k, []), np.float64) for k in ("train", "val")}
        if len(got["train"]) != 2 * len(self.train) or len(got["val"]) != 2 * len(self.val) or \
                not all(np.all(np.isfinite(v)) for v in got.values()):
            return False
        self.refs = got
        return True

    def sample(self, rng: np.random.Generator, B: int):
        """B // 2 pairs drawn at random -> (x [B, T], y [B, T], refs [B])."""
        picks = rng.integers(0, len(self.train), B // 2)
        x, y = pair_windows([self.train[i] for i in picks], self.T)
        return x, y, self.refs["train"].reshape(-1, 2)[picks].reshape(-1)

    def val_windows(self, max_windows: int | None = None):
        n = max(1, max_windows // 2) if max_windows else len(self.val)
        x, y = pair_windows(self.val[:n], self.T)
        return x, y, self.refs["val"][:2 * len(self.val[:n])]

    def describe(self) -> str:
        return (f"data: {self.name}: {len(self.train):,} preference pairs to train on, {len(self.val):,} held for "
                f"validation ({self.held}); a completion a window of {self.T:,}, the pair's two in one batch")


def preference_dataset(path, template, tok, stop: tuple, T: int, truncate: bool = False,
                       val_path=None) -> PreferenceData:
    """A DPO run's pairs: the file's, validated on val_path's or on its last 5 %; the digest of the
    files names the data its reference log-probabilities belong to."""
    pairs = read_preference_file(path, template, tok, stop, T, truncate)
    h = hashlib.sha256()
    for p in [path] + ([val_path] if val_path else []):
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    if val_path is not None:
        val = read_preference_file(val_path, template, tok, stop, T, truncate, f"{{opt:val_data}} {val_path}")
        return PreferenceData(pairs, val, T, str(path), f"the file {val_path}", h.hexdigest())
    if len(pairs) < 2:
        raise DataError(f"{{opt:data}} {path}: one pair; give at least two (the last 5 per cent are held back for "
                        "validation) or a validation file with {opt:val_data}")
    k = max(1, int(round(len(pairs) * VAL_SHARE)))
    return PreferenceData(pairs[:-k], pairs[-k:], T, str(path), f"the file's last {k:,}", h.hexdigest())

