"""The README's list of supported and refused operations is the compiler's own tables."""
from pathlib import Path

from coordinator.compiler.lowering import supported_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_lists_exactly_the_compilers_supported_operations():
    text = README.read_text()
    begin, end = "<!-- supported-ops:begin -->\n", "<!-- supported-ops:end -->"
    assert begin in text and end in text, "README lost its generated 'Supported operations' table"
    listed = text.split(begin, 1)[1].split(end, 1)[0]
    assert listed == supported_table(), (
        "README's table differs from the compiler's: regenerate it with "
        "python -m coordinator.compiler.lowering")
