import pytest

from engine.errors import TemplateError
from engine.generation import chat_template

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_template_renders_messages_and_generation_prompt():
    out = chat_template.render([{"role": "user", "content": "Hi"}], CHATML)
    assert out.mode == chat_template.TEMPLATE
    assert out.text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_model_without_template_gets_plain_completion_of_the_conversation():
    out = chat_template.render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The sky is"}], None
    )
    assert out.mode == chat_template.COMPLETION
    assert out.text == "Be brief.\n\nThe sky is"


def test_bos_in_template_is_detected_so_it_is_not_added_twice():
    out = chat_template.render([{"role": "user", "content": "x"}], "{{ bos_token }}{{ messages[0].content }}",
                               bos_token="<s>")
    assert out.has_bos and out.text == "<s>x"


def test_template_raise_exception_becomes_a_template_error():
    with pytest.raises(TemplateError, match="roles must alternate"):
        chat_template.render([{"role": "user", "content": "x"}], "{{ raise_exception('roles must alternate') }}")


def test_template_cannot_reach_python_internals():
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(TemplateError):
        chat_template.render([], evil)
