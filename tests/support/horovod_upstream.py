"""Horovod's own tests/horovod/upstream/parallel/test_torch.py in one rank of a `raylight run`
(tests/horovod/test_horovod_upstream.py):

    raylight run -n 2 -m raylight.horovod tests/support/horovod_upstream.py OUT_DIR [PYTEST_ARGS...]

Each rank runs the file with pytest, unchanged, and writes OUT_DIR/rank<R>.xml (JUnit). No
raylight conftest: its guards are for raylight's suite, not for Horovod's tests.
"""

import os
import sys

import pytest

UPSTREAM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "horovod", "upstream")


def main(out_dir: str, extra: list[str]) -> int:
    rank = os.environ["RANK"]
    report = os.path.join(out_dir, f"rank{rank}.xml")
    args = [os.path.join(UPSTREAM, "parallel", "test_torch.py"), "--noconftest", "-p", "no:cacheprovider",
            "-o", "addopts=", "-q", "--junitxml", report, *extra]
    return int(pytest.main(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
