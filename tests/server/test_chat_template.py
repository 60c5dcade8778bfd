"""Chat messages reach the model through its own chat template: a model whose
GGUF carries one answers a conversation exactly as it continues the text the
template renders for it."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from engine.server.engine_link import WorkerLink, load_request_for
from engine.server.runner import ServerThread
from tests import gguf_mutate as G
from tests.engine.conftest import synth
from tests.server.conftest import MODEL_ID, start_server

TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")


@pytest.fixture(scope="module")
def templated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    source = synth("glm4moe").path("combined")
    gguf = G.parse(source).with_kv("tokenizer.chat_template", G.value(G.STRING, TEMPLATE))
    path = gguf.write(tmp_path_factory.mktemp("templated") / "templated.gguf")
    link = WorkerLink(load_request_for(str(path), n_threads=1))
    server = start_server(link)
    yield server
    server.stop()
    link.close()


def test_roles_are_rendered_with_the_models_template(templated):
    client = openai.OpenAI(base_url=templated.base_url, api_key="x", max_retries=0, timeout=60)
    messages = [{"role": "system", "content": "river"}, {"role": "user", "content": "hello world"},
                {"role": "assistant", "content": "valley"}, {"role": "user", "content": "the"}]
    rendered = "[system] river\n[user] hello world\n[assistant] valley\n[user] the\n[assistant]"
    chat = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=16, temperature=0)
    plain = client.completions.create(model=MODEL_ID, prompt=rendered, max_tokens=16, temperature=0)
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens
    assert chat.choices[0].message.content == plain.choices[0].text != ""
    other = client.chat.completions.create(model=MODEL_ID, messages=messages[:2], max_tokens=16, temperature=0)
    assert other.usage.prompt_tokens < chat.usage.prompt_tokens
