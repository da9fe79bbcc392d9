"""The orchestration of ``./course grade``: see ``autograder/__init__.py``."""

import sys

# jsonschema (under nbformat) checks the "iri" string format with rfc3987-syntax when that is
# installed (Jupyter's event schemas pull it in), and importing it compiles 38 grammars: over two
# seconds in every process of the grade command, before it grades anything. Notebook schemas use
# no such format, so the command's processes go without it: jsonschema then skips that one check.
sys.modules.setdefault("rfc3987_syntax", None)
