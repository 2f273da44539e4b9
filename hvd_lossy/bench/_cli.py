"""Command lines of the benchmarks as Horovod users expect them: every default in --help, and
under a launcher one message from rank 0 instead of one per rank."""
import argparse
import os
import sys

# What mpirun (Open MPI, PMIx, MPICH) and horovodrun set in each rank's environment, so a
# command can tell its rank before Horovod or MPI is initialised (argument errors come first).
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "HOROVOD_RANK")


def launcher_rank():
    """This process's rank as its launcher set it, 0 when it was started alone."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults after every flag's help; descriptions keep their line breaks."""


class Parser(argparse.ArgumentParser):
    """argparse with defaults in --help, whose help and errors only rank 0 prints.

    Every rank parses the same argv, so every rank reaches the same verdict and exits with the
    same status (2 for an error); one copy of the message is enough. An error is one line:
    ``PROG: error: WHAT (see --help)``.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def _print_message(self, message, file=None):
        if launcher_rank() == 0:
            super()._print_message(message, file)

    def error(self, message):
        self._print_message(f"{self.prog}: error: {message} (see --help)\n", sys.stderr)
        self.exit(2)


def number(low=None, high=None, low_open=False, kind=float):
    """An argparse type: a number (int or float) within [low, high] (or (low, high] with
    low_open), refused in one line that names the value and the range."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        too_low = low is not None and (value <= low if low_open else value < low)
        if too_low or (high is not None and value > high) or value != value:
            sign = ">" if low_open else ">="
            want = " and ".join(x for x in (f"{sign} {low}" if low is not None else "",
                                            f"<= {high}" if high is not None else "") if x)
            raise argparse.ArgumentTypeError(f"must be {want}, got {text}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse
