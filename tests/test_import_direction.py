"""The packages depend in one direction, state <- encoder <- trainer <- streams, and none
imports the tests, the benchmarks or what they share (`testkit`); tests and benchmarks do not
import each other (checked on the source, so a lazy import counts too)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["state", "encoder", "trainer", "streams"]


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_imports_only_run_down_the_layers():
    wrong = []
    for rank, package in enumerate(ORDER):
        allowed = {f"hirflow.{p}" for p in ORDER[:rank + 1]}
        for path in sorted((ROOT / package).rglob("*.py")):
            for mod in _imports(path):
                top = mod.split(".")
                if top[0] in ("tests", "bench", "testkit", *ORDER):         # not through the namespace
                    wrong.append(f"{path.relative_to(ROOT)} imports {mod}")
                elif top[0] == "hirflow" and ".".join(top[:2]) not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not wrong, "\n".join(wrong)


def test_tests_and_benchmarks_share_only_the_testkit():
    wrong = [f"{path.relative_to(ROOT)} imports {mod}"
             for folder, other in (("tests", "bench"), ("bench", "tests"))
             for path in sorted((ROOT / folder).rglob("*.py"))
             for mod in _imports(path) if mod.split(".")[0] == other]
    assert not wrong, "\n".join(wrong)


def test_no_test_module_imports_another():
    """Helpers shared by tests live in helper modules (`helpers`, `conftest`, `testkit`)."""
    wrong = [f"{path.relative_to(ROOT)} imports {mod}"
             for folder in ("tests", "bench") for path in sorted((ROOT / folder).rglob("*.py"))
             for mod in _imports(path) if mod.split(".")[-1].startswith("test_")]
    assert not wrong, "\n".join(wrong)
