"""``python -m targets.fleet``: the same command as ``loadgen serve fleet``."""

from targets.fleet.cli import fleet_command

if __name__ == "__main__":
    fleet_command(prog_name="python -m targets.fleet")
