"""`python -m hvd_lossy.bench {codec,alltoall,netlink,soak} [options]`: runs one benchmark's main(argv)."""
import importlib
import sys

SUBCOMMANDS = {"codec": "hvd_lossy.bench.codec", "alltoall": "hvd_lossy.bench.alltoall",
               "netlink": "hvd_lossy.bench.netlink", "soak": "hvd_lossy.bench.soak"}


def main(argv):
    if not argv or argv[0] not in SUBCOMMANDS:
        got = repr(argv[0]) if argv else "nothing"
        sys.exit(f"usage: python -m hvd_lossy.bench {{{','.join(SUBCOMMANDS)}}} [options]; got {got}")
    # Imported on demand: each benchmark pulls in its own dependencies (Horovod for alltoall).
    module = importlib.import_module(SUBCOMMANDS[argv[0]])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
