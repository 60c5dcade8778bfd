"""``mtp-studio serve --chat-template``: one template for every chat request in place of the
model's, the generic ChatML one for a model without a template. The synthetic model has none:
without the option its messages are continued as text; with it, rendered as ChatML."""

from __future__ import annotations

import openai

from engine.generation import chat_template
from tests.server.conftest import MODEL_ID, start_server

MESSAGES = [{"role": "system", "content": "river"}, {"role": "user", "content": "hello world"}]
CHATML = "<|im_start|>system\nriver<|im_end|>\n<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"


def test_the_generic_template_renders_chatml_for_a_model_without_one(link, openai_client):
    generic = start_server(link, chat_template=chat_template.GENERIC_TEMPLATE)
    try:
        client = openai.OpenAI(base_url=generic.base_url, api_key="x", max_retries=0, timeout=120)
        chat = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=8, temperature=0)
        plain = client.completions.create(model=MODEL_ID, prompt=CHATML, max_tokens=8, temperature=0)
        assert chat.usage.prompt_tokens == plain.usage.prompt_tokens
        assert chat.choices[0].message.content == plain.choices[0].text
        without = openai_client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=8,
                                                        temperature=0)
        assert without.usage.prompt_tokens != chat.usage.prompt_tokens  # the model's own way: its text, continued
    finally:
        generic.stop()
