"""`python -m hvd_lossy.bench {codec,alltoall,netlink,soak} [options]`: runs one benchmark's main(argv)."""
import importlib
import sys

from hvd_lossy.bench._cli import launcher_rank

SUBCOMMANDS = {
    "codec": ("hvd_lossy.bench.codec", "codec ratio, GB/s and max error per level (one process)"),
    "alltoall": ("hvd_lossy.bench.alltoall",
                 "bytes on the wire and ms per call of the all-to-all (under mpirun -np N)"),
    "netlink": ("hvd_lossy.bench.netlink",
                "all-to-all and DLRM training over emulated 1-100 Gbit/s links (root, ip, tc)"),
    "soak": ("hvd_lossy.bench.soak",
             "random compressed all-to-alls, every element checked (under mpirun -np N)"),
}
USAGE = "usage: python -m hvd_lossy.bench {%s} [options]" % ",".join(SUBCOMMANDS)


def help_text():
    lines = [USAGE, "", "benchmarks:"]
    lines += [f"  {name:9} {about}" for name, (_, about) in SUBCOMMANDS.items()]
    lines += ["", "python -m hvd_lossy.bench NAME --help lists a benchmark's options and defaults."]
    return "\n".join(lines)


def main(argv):
    if argv and argv[0] in ("-h", "--help"):
        if launcher_rank() == 0:
            print(help_text())
        return 0
    if not argv or argv[0] not in SUBCOMMANDS:
        got = repr(argv[0]) if argv else "nothing"
        if launcher_rank() == 0:
            print(f"{USAGE}\npython -m hvd_lossy.bench: error: expected a benchmark name, got {got} "
                  "(see --help)", file=sys.stderr)
        return 2
    # Imported on demand: each benchmark pulls in its own dependencies (Horovod for alltoall).
    module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
