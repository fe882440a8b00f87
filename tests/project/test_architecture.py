"""The package's layering holds: import-linter's contracts in pyproject.toml (layers over the whole
package, no cycles between siblings at any depth), run as CI runs them."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in res.stdout


def test_every_module_is_given_a_layer():
    """exhaustive = true: a new top-level module or package outside the layers fails the contract."""
    import tomllib

    layers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    named = {n.strip() for layer in layers for n in layer.replace(":", "|").split("|")}
    pkg = ROOT / "src" / "tptune"
    top = {p.stem for p in pkg.glob("*.py")} | {p.name for p in pkg.iterdir() if (p / "__init__.py").exists()}
    assert top - {"__init__", "__main__"} == named
