"""The README's front door: its first code block is what CI runs, and every docs/ page is linked from it."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_first_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).splitlines()
    assert block == ["python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && "
                     "pip install -e '.[test]' && snakemake --cores 2", "python -m pytest -q"]
    ci = (ROOT / ".ci" / "run").read_text()
    for step in ("python -m pip install -q torch==2.13.0", "python -m pip install -q -e '.[test]'", "python -m pytest -q\n"):
        assert step in ci


def test_every_docs_page_is_linked_from_the_readme_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[^)#]+)", readme))
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, sorted(pages - linked)
    for page in pages:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", (ROOT / page).read_text()):
            assert (ROOT / "docs" / target).resolve().exists(), (page, target)
