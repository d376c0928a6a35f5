"""``python -m targets.sim``: see ``targets.sim.cli``."""

from targets.sim.cli import sim_command

if __name__ == "__main__":
    sim_command.main(prog_name="python -m targets.sim")
