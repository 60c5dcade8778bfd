import time

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


# -- limits (issue 17, item 4): templates come from strangers -----------------
NESTED_FOREVER = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"


def test_a_template_that_never_finishes_hits_the_time_limit():
    t0 = time.monotonic()
    with pytest.raises(TemplateError, match="time limit"):
        chat_template.render([], NESTED_FOREVER, time_limit_s=0.3)
    assert time.monotonic() - t0 < 2


def test_recursion_through_macros_hits_the_time_limit_or_a_clear_error():
    forever = "{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}"
    with pytest.raises(TemplateError):
        chat_template.render([], forever, time_limit_s=0.3)


def test_the_stop_callback_interrupts_rendering():
    calls = iter(range(10**9))
    t0 = time.monotonic()
    with pytest.raises(chat_template.RenderCancelled):
        chat_template.render([], NESTED_FOREVER, should_stop=lambda: next(calls) > 1000)
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize("bomb", [
    "{{ 'x' * 10**10 }}",
    "{{ ['x'] * 10**10 }}",
    "{{ 'ab' * 3000000 }}",
    "{{ 10 ** (10 ** 10) }}",
    "{{ 'x'|center(10**10) }}",
    "{{ 'x'|indent(10**10, true) }}",
    "{{ '%0*d'|format(10**10, 1) }}",
    "{{ '%010000000000d' % 1 }}",
    "{{ '{:>10000000000}'.format(1) }}",
    "{{ range(10**10)|list }}",
    "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
    "{% for i in range(99999) %}{{ 'x' * 99 }}{% endfor %}",
    "{{ range(200000)|length }}",
    "{{ range(99999)|join('x' * 999999) }}",
    "{{ ('x' * 999999)|replace('x', 'y' * 999999) }}",
    "{{ ('x' * 999999).replace('x', 'y' * 999999) }}",
    "{{ ('x' * 999999).join(range(99999)|map('string')) }}",
    "{{ ('\t' * 999999).expandtabs(999999) }}",
])
def test_memory_bombs_are_refused_with_a_size_limit(bomb):
    t0 = time.monotonic()
    with pytest.raises(TemplateError, match="limit"):
        chat_template.render([], bomb, max_chars=1_000_000, time_limit_s=5)
    assert time.monotonic() - t0 < 3


def test_ordinary_templates_still_work_within_the_limits():
    tmpl = ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
            "{{ m.role|upper }}: {{ m.content|trim }}{{ '\\n' }}{% endfor %}{{ ns.n }} {{ '=' * 3 }}"
            "{{ '%03d'|format(7) }} {{ '{:>4}'.format('x') }} {{ messages|length }} {{ range(3)|list }}"
            "{{ messages|map(attribute='role')|join(',') }}{{ 'ab'|replace('a', 'c') }}{{ '-'.join(['p', 'q']) }}")
    msgs = [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]
    out = chat_template.render(msgs, tmpl, max_chars=1000)
    assert out.text == "USER: hi\nASSISTANT: yo\n2 ===007    x 2 [0, 1, 2]user,assistantcbp-q"


def test_a_template_that_prints_a_lone_surrogate_is_a_template_error():
    # found by the chaos run, tests/chaos (gguf-043): it reached the tokenizer as an internal error
    from engine.errors import TemplateError
    from engine.generation.chat_template import render

    with pytest.raises(TemplateError, match="not valid Unicode"):
        render([{"role": "user", "content": "hi"}], "{{ '\\udcff' }}")


def test_filters_that_jinja2_makes_lazy_give_lists_as_llama_cpps_templates_expect():
    # llama-cpp-deepseek-r1.jinja prints `tools | map(attribute=...)`: jinja2 would print a generator's repr
    template = ("{{ tools | map(attribute='function') | map(attribute='name') }} "
                "{{ (tools | selectattr('type') | list) | length }}")
    tools = [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}]
    text = chat_template.render([{"role": "user", "content": "x"}], template, tools=tools).text
    assert text == "['a', 'b'] 2"
