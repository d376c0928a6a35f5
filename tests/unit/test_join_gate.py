"""The join gate: Locust's client_ready waits for the join secret; nobody speaks as another client."""

from __future__ import annotations

from types import SimpleNamespace

from loadgen.runtime.join_gate import install_join_gate


class _Runner:
    """The parts of Locust's MasterRunner the gate touches, recording what it is asked to do."""

    def __init__(self) -> None:
        self.handled: list[tuple[str, str]] = []
        self.sent: list[tuple[str, str, object]] = []
        self.connected: list[str] = []
        fire = lambda client_id: self.connected.append(client_id)  # noqa: E731
        self.environment = SimpleNamespace(events=SimpleNamespace(worker_connect=SimpleNamespace(fire=fire)))

    def handle_message(self, client_id: str, msg: SimpleNamespace) -> None:
        self.handled.append((client_id, msg.type))

    def send_message(self, msg_type: str, data: object = None, client_id: str | None = None) -> None:
        self.sent.append((msg_type, str(client_id), data))

    def get_worker_index(self, client_id: str) -> int:
        return 7


def _msg(msg_type: str, node_id: str) -> SimpleNamespace:
    return SimpleNamespace(type=msg_type, node_id=node_id, data=None)


def test_a_client_that_has_not_proved_the_secret_is_acked_and_challenged_but_not_listed() -> None:
    runner, verified = _Runner(), set()
    gate = install_join_gate(runner, verified.__contains__)
    runner.handle_message("h_1", _msg("client_ready", "h_1"))
    assert runner.handled == []  # Locust never lists it: no spawn, no heartbeat answers
    assert runner.sent == [("ack", "h_1", {"index": 7})]
    assert runner.connected == ["h_1"]  # loadgen's challenge goes out on this
    runner.handle_message("h_1", _msg("heartbeat", "h_1"))  # Locust ignores an unlisted client's
    assert runner.handled == [("h_1", "heartbeat")]
    verified.add("h_1")
    gate.admit("h_1")
    assert runner.handled[-1] == ("h_1", "client_ready")
    gate.admit("h_1")  # once only
    assert runner.handled.count(("h_1", "client_ready")) == 1


def test_a_verified_clients_client_ready_goes_straight_to_locust() -> None:
    runner = _Runner()
    install_join_gate(runner, lambda _id: True)
    runner.handle_message("h_2", _msg("client_ready", "h_2"))
    assert runner.handled == [("h_2", "client_ready")] and runner.sent == []


def test_a_message_in_another_clients_name_is_dropped() -> None:
    runner = _Runner()
    install_join_gate(runner, lambda _id: True)
    runner.handle_message("rogue_1", _msg("loadgen_final", "good_1"))
    assert runner.handled == []
    runner.handle_message("good_1", _msg("loadgen_final", "good_1"))
    assert runner.handled == [("good_1", "loadgen_final")]


def test_held_clients_are_told_to_quit_when_the_master_does() -> None:
    runner = _Runner()
    gate = install_join_gate(runner, lambda _id: False)
    runner.handle_message("h_4", _msg("client_ready", "h_4"))
    gate.quit_held()
    assert runner.sent[-1] == ("quit", "h_4", None)


def test_a_held_client_that_quits_is_forgotten() -> None:
    runner = _Runner()
    gate = install_join_gate(runner, lambda _id: False)
    runner.handle_message("h_3", _msg("client_ready", "h_3"))
    runner.handle_message("h_3", _msg("quit", "h_3"))
    assert gate.held == {}
