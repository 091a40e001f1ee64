"""torch's flight recorder in the hang report (parallel/flight.py): the
environment it needs, and the phrase that says which rank is behind. The
dump itself is tested where a rank really hangs (test_watchdog)."""

from __future__ import annotations

from hpcyolo_trainer.parallel import flight


def entry(seq: int, done: bool, name: str = "gloo:all_reduce", group: str = "0") -> dict:
    return {"collective_seq_id": seq, "profiling_name": name, "retired": done, "process_group": [group, "default_pg"],
            "is_p2p": False}


def test_the_recorder_is_on_and_a_sites_own_size_wins():
    env = {}
    flight.enable(env, "gloo")
    assert env == {flight.BUFFER_ENV: str(flight.ENTRIES)}
    env = {flight.BUFFER_ENV: "50"}
    flight.enable(env, "gloo")
    assert env[flight.BUFFER_ENV] == "50"


def test_nccl_dumps_on_its_own_timeout_into_the_hang_folder(tmp_path):
    env = {}
    flight.enable(env, "nccl", tmp_path / "hangs" / "7-0")
    assert env[flight.NCCL_DUMP_ENV] == "1"
    assert env[flight.DUMP_FILE_ENV] == str(tmp_path / "hangs" / "7-0" / "nccl-trace-rank-")
    assert (tmp_path / "hangs" / "7-0").is_dir()


def test_the_newest_collective_is_the_default_groups():
    trace = {"entries": [entry(5, True), entry(6, False), entry(9, False, group="1")]}
    assert flight.newest(trace) == {"seq": 6, "name": "gloo:all_reduce", "done": False}
    assert flight.newest({"entries": []}) is None


def test_the_phrase_names_who_is_behind_and_nothing_where_all_agree():
    behind = {0: flight.newest({"entries": [entry(42, False)]}), 1: flight.newest({"entries": [entry(41, True)]}),
              2: flight.newest({"entries": [entry(42, False)]})}
    assert flight.words(behind) == ("collectives (torch's flight recorder): ranks 0, 2 in #42 gloo:all_reduce; "
                                    "rank 1's last was #41 gloo:all_reduce (done)")
    alike = {0: {"seq": 3, "name": "x", "done": False}, 1: {"seq": 3, "name": "x", "done": False}}
    assert flight.words(alike) is None
    assert flight.words({0: None, 1: {"seq": 3, "name": "x", "done": False}}) is None
