"""The house stays as issue 22 left it: every record RESULTS.md names is in the tree, the records
stay small enough to clone, and no shipped source file grows past what one reader can hold."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
RECORDS = ROOT / "benchmarks" / "results"
MAX_RECORD_BYTES = 1_000_000  # "benchmarks/results/ under 1 MB"
MAX_LINES = 800               # "no shipped file above ~800 lines"


def expand(name):
    """`a_{x,y}.{json,txt}` -> every name the braces stand for."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [n for alt in m.group(1).split(",")
            for n in expand(name[:m.start()] + alt + name[m.end():])]


def cited_records(text):
    """(name, line) of every `results/NAME` RESULTS.md cites as in the tree: records moved to
    history are cited through `git show REV:benchmarks/results/NAME` and left out."""
    for m in re.finditer(r"`([^`]*?)(?<![\w/])results/([^`\s]+)`", text):
        if "git show" in m.group(1):
            continue
        line = text.count("\n", 0, m.start()) + 1
        for name in expand(m.group(2)):
            yield name.rstrip(".,;:)"), line


def test_the_citation_reader_expands_braces_and_skips_records_in_history():
    text = ("`results/a_{x,y}.{json,txt}` and `git show abc:benchmarks/results/gone.json`\n"
            "and `results/dir/`")
    assert sorted(cited_records(text)) == [("a_x.json", 1), ("a_x.txt", 1), ("a_y.json", 1),
                                           ("a_y.txt", 1), ("dir/", 2)]


def test_every_record_results_md_cites_is_in_the_tree():
    missing = []
    for name, line in cited_records(RESULTS.read_text()):
        path = RECORDS / name
        # a name may be a record's stem (`results/run` for run.json and run.txt)
        if not path.exists() and not any(path.parent.glob(path.name + ".*")):
            missing.append(f"RESULTS.md:{line}: results/{name}")
    assert not missing, "cited but not in benchmarks/results/ (cite it with git show):\n" + \
        "\n".join(missing)


def test_the_records_stay_under_one_megabyte():
    total = sum(p.stat().st_size for p in RECORDS.rglob("*") if p.is_file())
    assert total < MAX_RECORD_BYTES, (
        f"benchmarks/results/ holds {total:,} bytes, expected under {MAX_RECORD_BYTES:,}: move "
        "records a section no longer cites out of the tree and cite them with git show")


def test_no_shipped_source_file_is_longer_than_one_reader_holds():
    shipped = [p for p in (ROOT / "native").rglob("*")
               if p.suffix in (".cc", ".h", ".cu", ".cuh") and "testing" not in p.parts]
    shipped += list((ROOT / "hvd_lossy").rglob("*.py"))
    assert len(shipped) > 50  # the globs found the package
    long = {str(p.relative_to(ROOT)): n for p in shipped
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files above {MAX_LINES} lines, expected none (split them by stage): {long}"
