"""Thinking on/off read from prompts rendered by real chat templates (transformers' own renderer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_bench.thinking import detect, detect_ids

ASSETS = Path(__file__).resolve().parents[1] / "dflash_bench" / "assets" / "default_pair" / "target"
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]

# Generation-prompt parts of published templates, as quoted in issues and ports of them (Qwen3.6's
# chat_template.jinja lines 148-152; the gemma-4 26B/31B template's system turn and generation prompt).
QWEN36 = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)
GEMMA4 = (
    "{{- bos_token -}}"
    "{%- if (enable_thinking is defined and enable_thinking) or messages[0]['role'] in ['system', 'developer'] -%}"
    "{{- '<|turn>system\\n' -}}{%- if enable_thinking is defined and enable_thinking -%}{{- '<|think|>\\n' -}}"
    "{%- endif -%}{{- '<turn|>\\n' -}}{%- endif -%}"
    "{%- for message in messages -%}{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<|turn>' + role + '\\n' + message['content'] | trim + '<turn|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}"
    "{%- if not enable_thinking | default(false) -%}{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}{%- endif -%}"
)
# gemma-4 E2B's generation prompt has no pre-filled channel: off is only the missing <|think|>
GEMMA4_E2B = GEMMA4.replace("{%- if not enable_thinking | default(false) -%}{{- '<|channel>thought\\n<channel|>' -}}"
                            "{%- endif -%}", "")
# the shape of gpt-oss's harmony system message (the real template is long; the markers are these)
HARMONY = (
    "{{- '<|start|>system<|message|>You are ChatGPT.\\nReasoning: ' + (reasoning_effort | default('medium'))"
    " + '\\n\\n# Valid channels: analysis, commentary, final.<|end|>' -}}"
    "{%- for message in messages -%}{{- '<|start|>' + message.role + '<|message|>' + message.content + '<|end|>' -}}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"
)


@pytest.fixture(scope="module")
def tok():
    from dflash_bench.testing.tiny import make_tokenizer

    return make_tokenizer()


def render(tok, template: str, messages=MESSAGES, **kwargs) -> str:
    return tok.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True,
                                   **kwargs)


def test_embedded_pair_template_has_no_thinking_mode():
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(str(ASSETS))
    template = (ASSETS / "chat_template.jinja").read_text()
    prompt = t.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    state = detect(prompt, template)
    assert (state.mode, state.family) == ("off", "none")
    # without the template the prompt alone cannot say why there is no block
    assert detect(prompt).mode == "unknown"
    ids = t.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert detect_ids(ids, t, template).mode == "off"


@pytest.mark.parametrize("flag, mode", [(None, "on"), (True, "on"), (False, "off")])
def test_qwen3_style_self_opening_template(tok, flag, mode):
    kwargs = {} if flag is None else {"enable_thinking": flag}
    prompt = render(tok, tok.chat_template, **kwargs)
    assert detect(prompt, tok.chat_template).mode == mode
    # the tiny tokenizer keeps <think> as special tokens: decoded ids carry the same markers
    assert detect_ids(tok.encode(prompt), tok).mode == mode


@pytest.mark.parametrize("flag, mode", [(None, "on"), (True, "on"), (False, "off")])
def test_qwen36_forced_open_template_needs_no_template_to_decide(tok, flag, mode):
    kwargs = {} if flag is None else {"enable_thinking": flag}
    prompt = render(tok, QWEN36, **kwargs)
    assert detect(prompt).mode == mode


@pytest.mark.parametrize("template", [GEMMA4, GEMMA4_E2B])
@pytest.mark.parametrize("flag, mode", [(None, "off"), (True, "on"), (False, "off")])
def test_gemma4_templates(tok, template, flag, mode):
    kwargs = {} if flag is None else {"enable_thinking": flag}
    prompt = render(tok, template, **kwargs)
    state = detect(prompt, template)
    assert (state.mode, state.family) == (mode, "gemma4")


@pytest.mark.parametrize("template", [GEMMA4, GEMMA4_E2B])
def test_gemma4_think_marker_in_a_user_turn_does_not_count(tok, template):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "what does <|think|> do?"}]
    assert detect(render(tok, template, messages, enable_thinking=False), template).mode == "off"
    assert detect(render(tok, template, messages, enable_thinking=True), template).mode == "on"


def test_multi_turn_qwen_reads_the_last_assistant_turn(tok):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>\n\n</think>\n\nhello"},
                {"role": "user", "content": "and now?"}]
    assert detect(render(tok, QWEN36, messages)).mode == "on"
    assert detect(render(tok, QWEN36, messages, enable_thinking=False)).mode == "off"


@pytest.mark.parametrize("effort", ["low", "medium", "high"])
def test_harmony_always_reasons_and_reports_its_effort(tok, effort):
    state = detect(render(tok, HARMONY, reasoning_effort=effort), HARMONY)
    assert (state.mode, state.family, state.effort) == ("on", "harmony", effort)


def test_a_user_asking_about_reasoning_effort_is_not_harmony(tok):
    prompt = render(tok, tok.chat_template, [{"role": "user", "content": "Reasoning: high, please"}],
                    enable_thinking=False)
    assert detect(prompt, tok.chat_template).family == "qwen-think"


def test_template_hash_tells_templates_apart():
    from dflash_bench.thinking import template_hash

    template = (ASSETS / "chat_template.jinja").read_text()
    assert template_hash(template) != template_hash(template + " ")
    assert template_hash(QWEN36).startswith("sha256:") and len(template_hash(QWEN36)) == 7 + 16
