"""Nonsense input to the DLRM example under 2 ranks (run by tests/test_dlrm.py under mpirun).

For each bad input, train.main() must exit with status 2 on every rank, rank 0 must print one
line naming the problem, the other ranks nothing, and no traceback. Usage: dlrm_errors.py TMP_DIR
"""
import contextlib
import io
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "dlrm"))

import horovod.torch as hvd  # noqa: E402

import train  # noqa: E402


def expect_failure(argv, message):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            train.main(argv + ["--no-progress"])
        except SystemExit as e:
            code = e.code
        else:
            code = 0
    text = err.getvalue()
    assert code == 2, (argv, code, text)
    assert "Traceback" not in text, text
    if hvd.rank() == 0:
        assert message in text and text.count("train.py: error:") == 1, (message, text)
    else:
        assert text == "", text


def main():
    tmp = sys.argv[1]
    hvd.init()
    bad_dir = os.path.join(tmp, "bad_rank%d" % hvd.rank())
    os.makedirs(bad_dir, exist_ok=True)
    with open(os.path.join(bad_dir, "train.txt"), "w") as f:
        f.write("0\t" + "\t".join(["1"] * 13 + ["68fd1e64"] * 26) + "\n" + "1\t2\t3\n")
    expect_failure(["--batch-size", "127"], "--batch-size 127 is not divisible by the 2 ranks")
    expect_failure(["--data", os.path.join(tmp, "no_such_dir")], "is not a folder")
    expect_failure(["--data", bad_dir], "line 2 has 3 tab-separated fields, expected 40")
    expect_failure(["--max-table-rows", "1"], "--max-table-rows must be >= 2")
    expect_failure(["--batch-size", "100000"], "larger than the 7200 training rows")
    expect_failure(["--compression", "lossy", "--error-bound", "-1"], "error bounds must be >= 0")
    expect_failure(["--policy", "sensitivity"], "--policy applies only to --compression adaptive")
    expect_failure(["--compression", "adaptive", "--policy", "nope"],
                   "argument --policy: invalid choice: 'nope'")
    expect_failure(["--no-such-flag"], "unrecognized arguments: --no-such-flag")
    print("dlrm_errors rank %d ok" % hvd.rank())


if __name__ == "__main__":
    main()
