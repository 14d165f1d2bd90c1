"""Chat templates run as code from elsewhere would: in Jinja2's sandbox, their output bounded, their
own refusals one line; conversations checked before they are rendered; ChatML for a model without
a template. And the sampler's window follows the tokens: a decoder over the prompt's and reply's
power of two gives the tokens one over the whole context gives, and a held prefix fed through the
decode step gives what a fresh prefill gives."""
import numpy as np
import pytest

from tinygpt.core.errors import UsageError
from tinygpt.model.spec import rows_for
from tinygpt.tokenizers.chat import ChatTemplate, TemplateError

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_chatml_is_the_template_of_a_model_without_one():
    t = ChatTemplate(None)
    assert not t.own
    assert t.render(CONVERSATION) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                      "<|im_start|>assistant\n")
    assert t.render(CONVERSATION, add_generation_prompt=False).endswith("Hi<|im_end|>\n")


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{% set x = messages.append({'role': 'user', 'content': 'x'}) %}{{ x }}",
    "{% for i in range(10**9) %}{{ 'xxxxxxxx' }}{% endfor %}",
    "{% for i in range(99999) %}{% for j in range(99999) %}{{ 'xxxxxxxx' }}{% endfor %}{% endfor %}",
])
def test_a_template_that_reaches_for_python_or_never_ends_is_refused_in_one_line(source):
    with pytest.raises(TemplateError) as e:
        ChatTemplate(source).render(CONVERSATION)
    print(source, "->", e.value)
    assert "\n" not in str(e.value)


def test_a_templates_own_refusal_reaches_the_user():
    src = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation roles must alternate "
           "user/assistant/user/assistant/...') }}{% endif %}{{ messages[0]['content'] }}")
    with pytest.raises(TemplateError, match="roles must alternate"):
        ChatTemplate(src).render(CONVERSATION)
    assert ChatTemplate(src).render(CONVERSATION[1:]) == "Hi"


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "user"}], [{"role": "wizard", "content": "x"}],
                                      [{"role": "user", "content": 3}], [["user", "hi"]]])
def test_a_conversation_is_checked_before_it_is_rendered(messages):
    with pytest.raises(UsageError):
        ChatTemplate(None).render(messages)


def test_rows_follow_the_tokens():
    assert rows_for(8192, 37 + 40) == 128
    assert rows_for(8192, 1) == 64 and rows_for(32, 1) == 32
    assert rows_for(8192, 9000) == 8192
    assert rows_for(100, 65) == 100


@pytest.mark.kernel
@pytest.mark.parametrize("block", ["gpt2", "llama"])
def test_a_short_window_and_a_held_prefix_sample_what_the_whole_context_does(gpu, block):
    """Greedy tokens of a decoder over 16 rows of a 64-context model equal those over all 64
    (learned positions cut to the rows, or RoPE); the prompt extended and fed through the decode
    step from the held cache equals a fresh prefill of it; a stop id ends the sequence before it."""
    from tinygpt.core.config import preset
    from tinygpt.core.init import init_params
    from tinygpt.device.planner import make_plan
    from tinygpt.model.decode import Decoder
    from tinygpt.model.spec import decoder_spec
    parts = {} if block == "gpt2" else dict(norm="rmsnorm", position="rope", activation="swiglu", bias="none",
                                            kv_heads=1)
    cfg = preset("tiny", ctx=64, vocab=96, **parts).validate()
    rng = np.random.default_rng(1)          # off the init, so that the greedy tokens vary
    params = {k: (v + rng.normal(0, 0.3, v.shape)).astype(np.float32) for k, v in init_params(cfg).items()}
    plan = make_plan(gpu, {})
    prompt = [5, 17, 3, 40, 2]
    got = {}
    for rows in (16, None):
        d = Decoder(gpu, plan, decoder_spec(cfg, rows=rows), 8)
        d.set_params(params)
        got[rows] = d.generate(prompt, 8, stop=())[0]
    assert got[16] == got[None], got
    held = Decoder(gpu, plan, decoder_spec(cfg, rows=32), 8)
    held.set_params(params)
    first = held.generate(prompt, 4, stop=())[0]
    longer = first + [9, 11]
    fresh = Decoder(gpu, plan, decoder_spec(cfg, rows=32), 8)
    fresh.set_params(params)
    a, b = held.generate(longer, 6, stop=())[0], fresh.generate(longer, 6, stop=())[0]
    print(f"{block}: window 16 = context 64: {got[16][5:]}; held prefix {a[len(longer):]}, fresh {b[len(longer):]}")
    assert a == b
    k = max(i for i in range(len(longer), len(b)) if b[i] not in b[len(longer):i])   # a token's first draw
    cut = fresh.generate(longer, 6, stop=[b[k]])[0]
    assert cut == b[:k]


@pytest.mark.kernel
@pytest.mark.parametrize("command", ["sample", "chat", "eval", "inspect"])
def test_a_command_over_the_memory_it_has_is_refused_before_it_allocates(tmp_path, monkeypatch, capsys, command):
    """Issue 67: sample, chat, eval and inspect count their buffers and weights before allocating; over the
    memory available (forced low here) each is refused in one line naming what would fit, exit 4."""
    import io
    import sys
    from support import run_cli
    from tinygpt.model import budget
    model = tmp_path / "m.tinygpt"
    assert run_cli("train", "--preset", "tiny", "--ctx", 128, "--steps", 1, "--quiet", "--sample-tokens", 0,
                   "--eval-every", 0, "--out", model) == 0
    monkeypatch.setattr(budget, "available_memory", lambda: 100_000)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    capsys.readouterr()
    args = {"sample": ["--tokens", 5], "chat": ["--max-tokens", 5], "eval": ["--max-windows", 2],
            "inspect": ["--prompt", "To be", "--out", tmp_path / "att.png"]}[command]
    assert run_cli(command, "--model", model, *args) == 4
    err = capsys.readouterr().err.strip().splitlines()
    print(err[-1])
    notes = [l for l in err[:-1] if not l.startswith(("the model has no chat template", "the model names no end"))]
    assert not notes and "does not fit" in err[-1] and "100,000" in err[-1], err     # chat says its notes first
    assert {"sample": "--num-samples", "chat": "--max-tokens", "eval": "--ctx", "inspect": "--prompt"}[command] \
        in err[-1]
    assert not (tmp_path / "att.png").exists()


@pytest.mark.kernel
def test_the_apis_loads_count_their_memory_first(tmp_path, monkeypatch):
    """Issue 67: GPT.logits, generate and chat count what they would allocate before allocating;
    over the memory available (forced low) each is refused in one line in the API's words."""
    from tinygpt import GPT
    from tinygpt.model import budget
    gpt = GPT.from_preset("tiny", ctx=128)             # room for a ChatML prompt of bytes
    monkeypatch.setattr(budget, "available_memory", lambda: 100_000)
    for call, says in ((lambda: gpt.logits("To be"), "fewer or shorter windows"),
                       (lambda: gpt.generate("To be", 5), "max_new_tokens"),
                       (lambda: gpt.chat([{"role": "user", "content": "Hi"}], 5), "max_new_tokens")):
        with pytest.raises(budget.DoesNotFit) as e:
            call()
        print(e.value)
        assert "does not fit" in str(e.value) and says in str(e.value) and "\n" not in str(e.value)
    assert gpt._evaluator is None and gpt._decoder is None
