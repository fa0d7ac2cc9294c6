"""A chat template without a system role (it raises on one, as Gemma's does), served for
real: a 3-rank job of the tiny generated model with such a template. A request with a
system message is answered, its system text folded into the user's message as llama-server
folds it (model/chat_template.py): the prompt is the template's rendering of that user
message (its tokens counted in `usage`), and the greedy answer is llama.cpp's for that
prompt."""

from __future__ import annotations

import gguf
import httpx
import pytest

from support import tinymodel
from pipeinfer.model.tokenizer import Tokenizer
from pipeinfer.serve import tool_formats
from pipeinfer.api.tool_calls import GENERIC
from pipeinfer.serve.tool_formats import GENERIC_SYSTEM
from support.llama_oracle import llama_greedy
from support.serving import AUTH, KEY, Server, openai_client, serving

N_CTX = 1024
NO_SYSTEM = (   # the tiny model's ChatML template, refusing the system role
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
ASK = [{"role": "system", "content": "You answer in code."},
       {"role": "user", "content": "Print the time"}]
FOLDED = ("<|im_start|>user\nYou answer in code.\nPrint the time<|im_end|>\n"
          "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def model(tiny_model, tmp_path_factory):
    def edit(name, value):
        return NO_SYSTEM if name == gguf.Keys.Tokenizer.CHAT_TEMPLATE else value
    return tinymodel.copy_gguf(tiny_model, tmp_path_factory.mktemp("no-system") /
                               "tiny-no-system.gguf", edit=edit)


@pytest.fixture(scope="module")
def tokenizer(model):
    tok = Tokenizer(model)
    yield tok
    tok.close()


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve-no-system"), 3, "-m", str(model),
                 "-c", str(N_CTX), "--api-key", KEY, "--alias", "tiny", "--parallel", "1",
                 "--no-cache-prompt")
    yield from serving(srv, 120)


def test_the_prompt_has_the_system_text_before_the_users(tokenizer):
    template = tokenizer.chat_template()
    assert not template.supports_system_role
    assert tokenizer.chat_tokens(ASK) == tokenizer.tokenize(FOLDED)
    # (the template itself refuses the conversation as it is)
    with pytest.raises(ValueError, match="System role not supported"):
        template.render(ASK)


@pytest.mark.slow
def test_a_system_message_is_folded_when_served(server, model, tokenizer):
    client = openai_client(server, 120)
    prompt = tokenizer.tokenize(FOLDED)
    answer = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=8,
                                            temperature=0, logprobs=True)
    assert answer.usage.prompt_tokens == len(prompt)
    tokens = llama_greedy(model, prompt, 8, n_ctx=N_CTX, repack=True)
    end = next((i for i, t in enumerate(tokens) if tokenizer.is_eog(t)), len(tokens))
    # (the tokens' bytes: the random model's text may end inside a character)
    assert [bytes(e.bytes) for e in answer.choices[0].logprobs.content] == [
        tokenizer.piece(t) for t in tokens[:end]]


@pytest.mark.slow
def test_the_generic_tool_format_s_system_message_is_folded_too(server, tokenizer):
    """Tools with this template: the generic format (serve/tool_formats.py) asks for JSON in
    a system message of its own, folded with the request's into the user's message."""
    template = tokenizer.chat_template()
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}}]
    assert tool_formats.tool_format(template) == GENERIC
    messages = tool_formats.conversation(template, ASK, tools, GENERIC)
    text = template.render(template.with_system_folded(messages), tools=tools)
    user = text.split("<|im_start|>user\n", 1)[1]
    assert text.startswith("<|im_start|>user\n") and "system" not in text
    assert user.index("You answer in code.") < user.index(GENERIC_SYSTEM) \
        < user.index("get_time") < user.index("Print the time")
    r = httpx.post(server.url + "/v1/chat/completions", headers=AUTH, json={
        "messages": ASK, "tools": tools, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(tokenizer.tokenize(text))
