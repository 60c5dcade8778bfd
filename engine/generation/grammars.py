"""GBNF grammars for constrained output, from JSON schemas.

The conversion is llama-cpp-python's ``llama_grammar.SchemaConverter`` (a
port of llama.cpp's ``json-schema-to-grammar``, maintained upstream with the
grammar engine it feeds), not a converter of our own. Its module is pure
Python, but importing it as ``llama_cpp.llama_grammar`` would run the
package's ``__init__``, which loads the native library; the server must
never do that, and it needs the grammar before it queues a request (a bad
schema is a 400 at once, not an engine error later). So the one module file
is loaded by path, without its package.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from types import ModuleType
from typing import Any

from engine.errors import GrammarError


@functools.cache
def _converter_module() -> ModuleType:
    spec = importlib.util.find_spec("llama_cpp")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise GrammarError("llama-cpp-python is not installed, so JSON schemas cannot be turned into grammars; "
                           "run packaging/bootstrap.sh")
    path = f"{list(spec.submodule_search_locations)[0]}/llama_grammar.py"
    loaded = importlib.util.spec_from_file_location("mtp_studio_llama_grammar", path)
    if loaded is None or loaded.loader is None:
        raise GrammarError(f"The JSON schema converter is missing from llama-cpp-python ({path}).")
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


class SchemaRules:
    """Several JSON schemas as rules of one grammar (each under its own name), plus rules of the caller's.

    Rule names may only hold letters, digits and dashes; the converter names the helper rules it
    needs after the rule it visits, so two schemas never collide.
    """

    def __init__(self) -> None:
        module = _converter_module()
        self._converter = module.SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)

    def schema(self, schema: dict[str, Any], name: str) -> str:
        """Add ``schema`` (``{}``: any JSON object); returns the name of its rule.

        Raises:
            GrammarError: the schema uses what the converter cannot express.
        """
        if not isinstance(schema, dict):
            raise GrammarError("A JSON schema must be an object.")
        if not schema:  # JSON mode: any object, as OpenAI's json_object promises
            schema = {"type": "object"}
        try:
            resolved = self._converter.resolve_refs(json.loads(json.dumps(schema)), "input")
            return str(self._converter.visit(resolved, name))
        except RecursionError:
            raise GrammarError("The JSON schema is nested too deeply.") from None
        except Exception as exc:  # the converter raises bare exceptions for what it cannot express
            raise GrammarError(f"The JSON schema cannot be turned into a grammar: {type(exc).__name__}: "
                               f"{exc}") from None

    def rule(self, name: str, body: str) -> str:
        """Add a rule of the caller's (GBNF); returns its name (made unique if taken)."""
        return str(self._converter._add_rule(name, body))

    def literal(self, text: str) -> str:
        """``text`` as a GBNF string literal."""
        return str(self._converter._format_literal(text))

    def text(self) -> str:
        return str(self._converter.format_grammar())


def from_json_schema(schema: dict[str, Any]) -> str:
    """GBNF whose root is JSON text following ``schema`` (``{}``: any JSON object).

    Raises:
        GrammarError: the schema uses what the converter cannot express.
    """
    rules = SchemaRules()
    top = rules.schema(schema, "")
    if top != "root":  # a schema that is only a $ref or a literal names its rule otherwise
        rules.rule("root", top)
    return rules.text()
