"""``autotune scheduler`` with an injected clock (docs/nightly.md#8-the-scheduler): restarted
between ticks it keeps its schedules and never runs a fire time twice; a scheduler that was
down over several fire times runs one catch-up run; exactly one scheduler is active."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support.nightly import write_config

from autotune import cli
from autotune.errors import BusyError, ConfigError
from autotune.nightly.job_records import (
    DecisionRecord,
    ScheduleRecord,
    add_decision,
    add_schedule,
    get_schedule,
    schedules,
)
from autotune.nightly.scheduler import Scheduler, check_cron, due_fire
from autotune.store import Store

T0 = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)


class FakeClock:
    def __init__(self, t: datetime) -> None:
        self.t = t

    def __call__(self) -> datetime:
        return self.t


def make(url: str, clock: FakeClock, ran: list[tuple[str, datetime]]) -> tuple[Store, Scheduler]:
    store = Store.open(url)

    def run(s: ScheduleRecord) -> int:
        ran.append((s.name, clock()))
        return 3

    return store, Scheduler(store, clock=clock, run=run)


def test_restart_between_ticks_never_double_runs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    with Store.open(url) as store:
        add_schedule(store, ScheduleRecord("nightly", "0 2 * * *", "/x/n.yaml", T0))
        add_schedule(store, ScheduleRecord("paris", "0 2 * * *", "/x/p.yaml", T0, "Europe/Paris"))
    clock, ran = FakeClock(T0 + timedelta(hours=1)), []  # 01:00 UTC = 02:00 Paris
    store, s = make(url, clock, ran)
    assert [f.name for f in s.tick()] == ["paris"]
    clock.t = T0 + timedelta(hours=1, minutes=30)
    assert s.tick() == []
    store.close()
    # restart at 02:00:30 UTC: the UTC schedule is due once, Paris already ran
    clock.t = T0 + timedelta(hours=2, seconds=30)
    store, s = make(url, clock, ran)
    assert [(f.name, f.fire_at) for f in s.tick()] == [("nightly", T0 + timedelta(hours=2))]
    store.close()
    for minutes in (1, 5, 59):  # restarted again and again later that night: nothing
        clock.t = T0 + timedelta(hours=2, minutes=minutes)
        store, s = make(url, clock, ran)
        assert s.tick() == []
        store.close()
    assert [n for n, _ in ran] == ["paris", "nightly"]
    with Store.open(url) as store:
        rec = get_schedule(store, "nightly")
        assert rec is not None and rec.last_fire_at == T0 + timedelta(hours=2)
        assert rec.last_exit_code == 3 and len(schedules(store)) == 2


def test_misfires_get_one_catch_up_run_not_a_burst(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    with Store.open(url) as store:
        add_schedule(store, ScheduleRecord("nightly", "0 2 * * *", "/x/n.yaml", T0))
    clock, ran = FakeClock(T0 + timedelta(days=4, hours=3)), []  # down over 4 fire times
    store, s = make(url, clock, ran)
    fired = s.tick()
    assert [f.fire_at for f in fired] == [T0 + timedelta(days=4, hours=2)]
    assert s.tick() == [] and len(ran) == 1
    # the next night fires normally
    clock.t = T0 + timedelta(days=5, hours=2, minutes=1)
    assert len(s.tick()) == 1 and s.seconds_to_next() == 60.0
    store.close()


def test_a_new_schedule_does_not_fire_for_the_past() -> None:
    rec = ScheduleRecord("n", "0 2 * * *", "/x", T0 + timedelta(hours=3))
    assert due_fire(rec, T0 + timedelta(hours=4)) is None
    assert due_fire(rec, T0 + timedelta(days=1, hours=2)) == T0 + timedelta(days=1, hours=2)
    with pytest.raises(ConfigError):
        check_cron("every night")


def test_exactly_one_scheduler_is_active(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    clock, ran = FakeClock(T0), []
    store_a, a = make(url, clock, ran)
    store_b, b = make(url, clock, ran)
    tried: list[bool] = []

    def second(_seconds: float) -> None:
        with pytest.raises(BusyError, match="another autotune scheduler is active"):
            b.serve(once=True)
        tried.append(True)
        a.stop()

    a.sleep = second
    a.serve()  # b tries while a holds the lock (a's first sleep)
    assert tried == [True]
    b.serve(once=True)  # a let go: b may run now
    store_a.close()
    store_b.close()


def test_schedule_cli_add_list_remove(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    cfg = write_config(tmp_path)

    def run(args: list[str]) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as info:
            cli.main([*args, "--storage", url])
        out, err = capsys.readouterr()
        return int(info.value.code or 0), out, err

    code, out, _ = run(["schedule", "add", "chat", "--cron", "0 2 * * *", "--config", str(cfg)])
    assert code == 0 and "next " in out
    code, _, err = run(["schedule", "add", "bad", "--cron", "nope", "--config", str(cfg)])
    assert code == 1 and err.startswith("error: --cron: 'nope' is not a cron expression")
    code, out, _ = run(["schedule", "list"])
    assert code == 0 and "chat  0 2 * * * (UTC)" in out and "never run" in out
    code, out, _ = run(["schedule", "remove", "chat"])
    assert code == 0
    code, _, err = run(["schedule", "remove", "chat"])
    assert code == 4 and "no schedule named 'chat'" in err


def test_the_default_runner_runs_autotune_nightly_in_a_child(tmp_path: Path) -> None:
    """The child gets the database from its environment: today's decision (seeded) is
    re-emitted, with its exit status recorded and the output file written."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    cfg = write_config(tmp_path)
    now = datetime.now(UTC)
    to_midnight = (24 * 3600) - (now.hour * 3600 + now.minute * 60 + now.second)
    if to_midnight < 60:  # the child must see the same UTC date
        time.sleep(to_midnight + 1)
        now = datetime.now(UTC)
    args = {
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.9,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 2048,
    }
    with Store.open(url) as store:
        add_decision(
            store,
            DecisionRecord(
                "chat",
                now,
                "promote",
                "seeded",
                args,
                args,
                3,
                study_name=f"chat-{now:%Y%m%d}",
                command="vllm serve m",
            ),
        )
        add_schedule(store, ScheduleRecord("n", "* * * * *", str(cfg), now - timedelta(hours=1)))
        fired = Scheduler(store).tick()  # the default runner: a child process
    assert [(f.name, f.exit_code) for f in fired] == [("n", 3)]
    written = (tmp_path / "out" / "chat.yaml").read_text(encoding="utf-8")
    assert "decision: promote" in written and "max_model_len: 4096" in written
