"""The served chat prompt is the GGUF's own Jinja template rendered as llama-server (--jinja)
and llama-cpp-python's Jinja2ChatFormatter render it: the prompt tokens equal
llama-cpp-python's for the same messages and template (SmolLM2's template adds a default
system message, which llama.cpp's built-in C++ rendering of "chatml" leaves out)."""

from __future__ import annotations

import pytest

from pipeinfer.model.chat_template import ChatTemplate, ChatTemplateError
from pipeinfer.model.tokenizer import Tokenizer
from support.cached_models import cached_models
from support.llama_oracle import llama_chat_tokens

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name a prime."},
     {"role": "assistant", "content": "7"},
     {"role": "user", "content": "Another, in Ελληνικά please."}],
    [{"role": "user", "content": "def f(x):\n    return x  # fix me\n"}],
]

@pytest.mark.smollm2
@pytest.mark.parametrize("which", ["smollm2", "qwen"])
def test_chat_prompt_equals_llama_cpp_python_jinja(which, smollm2):
    model = smollm2 if which == "smollm2" else cached_models("qwen-coder-0.5b")[0]
    tokenizer = Tokenizer(model)
    try:
        for messages in CONVERSATIONS:
            assert tokenizer.chat_tokens(messages) == llama_chat_tokens(model, messages)
    finally:
        tokenizer.close()


@pytest.mark.smollm2
def test_smollm2_template_adds_its_default_system_message(smollm2):
    tokenizer = Tokenizer(smollm2)
    try:
        tokens = tokenizer.chat_tokens(CONVERSATIONS[0])
        text = tokenizer.detokenize(tokens)
        builtin = tokenizer.tokenize(tokenizer.apply_chat_template([("user", "Hello!")]))
    finally:
        tokenizer.close()
    assert "You are a helpful AI assistant named SmolLM" in text
    assert len(tokens) == len(builtin) + 21   # its default system message: 21 tokens more
    assert tokens[-len(builtin):] == builtin


def test_template_helpers_and_errors():
    source = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}"
              "{{ raise_exception('no tools here') }}{% endif %}[{{ m.role }}]{{ m.content }}"
              "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
              "{{ {'k': 'é'} | tojson }}")
    template = ChatTemplate(source, "<s>", "</s>")
    text = template.render([{"role": "user", "content": "hi"}])
    assert text == '<s>[user]hi</s>[assistant]{"k": "é"}'
    thinking = ChatTemplate("{% if enable_thinking is defined and not enable_thinking %}"
                            "/no_think{% endif %}{{ messages[0].content }}", "", "")
    assert thinking.render([{"role": "user", "content": "x"}], enable_thinking=False) \
        == "/no_think" + "x"   # llama-server's chat_template_kwargs
    with pytest.raises(ChatTemplateError, match="no tools here"):
        template.render([{"role": "tool", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}", "", "")
    with pytest.raises(ChatTemplateError):   # the sandbox refuses attribute games
        ChatTemplate("{{ messages.__class__.__mro__ }}", "", "").render([])


# A template without a system role, as Gemma's and older Mistral's raise on one; and one that
# leaves system messages out without a word.
NO_SYSTEM = ("{% for m in messages %}{% if m.role == 'system' %}"
             "{{ raise_exception('System role not supported') }}{% endif %}"
             "<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
             "{% if add_generation_prompt %}<assistant>{% endif %}")
DROPS_SYSTEM = ("{% for m in messages %}{% if m.role != 'system' %}"
                "<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endif %}{% endfor %}")
CHATML = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
          "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_a_template_without_a_system_role_gets_it_in_the_user_message():
    """As llama-server (minja's polyfill): system messages joined by "\\n" before the next
    user message's content, "\\n" between; before another role, a user message of their
    own; a template with the role renders exactly as before."""
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Salut !"},
                {"role": "system", "content": "Now in English."},
                {"role": "assistant", "content": None, "tool_calls": []},
                {"role": "user", "content": ""}]
    for source in (NO_SYSTEM, DROPS_SYSTEM):
        template = ChatTemplate(source, "", "")
        assert not template.supports_system_role
        folded = template.with_system_folded(messages)
        assert folded == [{"role": "user", "content": "Be brief.\nAnswer in French.\nHi!"},
                          messages[3], messages[5],
                          {"role": "user", "content": "Now in English."}]   # (into the empty one)
    assert ChatTemplate(NO_SYSTEM, "", "").render(
        ChatTemplate(NO_SYSTEM, "", "").with_system_folded(messages[:4])) == \
        "<user>Be brief.\nAnswer in French.\nHi!</user><assistant>Salut !</assistant><assistant>"
    assert ChatTemplate(NO_SYSTEM, "", "").with_system_folded(
        [messages[4], messages[3]]) == [{"role": "user", "content": "Now in English."},
                                        messages[3]]
    chatml = ChatTemplate(CHATML, "", "")
    assert chatml.supports_system_role and chatml.with_system_folded(messages) == messages
