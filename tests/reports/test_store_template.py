"""``reports.record.create_store``: a process's first new store is made by MLflow's migrations, its later ones are
copies of that empty store (the migrations cost 1-3 CPU-seconds a store): each one whole, of MLflow's schema, as
usable as the first."""

from __future__ import annotations

import sqlite3

from mlflow.tracking import MlflowClient

from reports import record


def _schema(db) -> tuple[list[tuple[str, str]], list[str], int]:
    """(tables and indexes with their SQL, alembic revision, experiments) of a store, read before MLflow opens it."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        objects = sorted(con.execute("select name, sql from sqlite_master where sql is not null").fetchall())
        revision = [r[0] for r in con.execute("select version_num from alembic_version")]
        experiments = con.execute("select count(*) from experiments").fetchone()[0]
    finally:
        con.close()
    return objects, revision, experiments


def test_later_stores_of_a_process_are_copies_of_its_first_and_as_usable(tmp_path, monkeypatch):
    migrated = []
    real = record._migrate
    monkeypatch.setattr(record, "_EMPTY_STORE", {})  # (this process's first store, as in a fresh one)
    monkeypatch.setattr(record, "_migrate", lambda path: (migrated.append(path), real(path)))
    stores = [tmp_path / f"s{i}" / "mlflow.db" for i in range(3)]
    for db in stores:
        db.parent.mkdir()
        record.create_store(db)
    assert len(migrated) == 1  # (the first only)
    first = _schema(stores[0])
    assert first[1] and first[0] and first[2] == 0, first  # (MLflow's tables, its revision; no experiment yet)
    for db in stores:
        assert _schema(db) == first
        assert sorted(p.name for p in db.parent.iterdir()) == ["mlflow.db"]  # (nothing left at the temporary name)
        client = MlflowClient(f"sqlite:///{db}")
        run = client.create_run(client.create_experiment("e", artifact_location=str(db.parent / "a")))
        client.log_metric(run.info.run_id, "m", 1.0)
        client.set_terminated(run.info.run_id)
        assert client.get_run(run.info.run_id).data.metrics == {"m": 1.0}


def test_a_copy_that_cannot_be_written_leaves_no_store(tmp_path, monkeypatch):
    """As a creation the migrations could not finish: nothing at ``db``, nothing at the temporary name."""
    import builtins

    import pytest

    made = tmp_path / "made" / "mlflow.db"
    made.parent.mkdir()
    record.create_store(made)  # (the template, if this process had none)

    class FullDisk:
        """A file whose write stops part way, as on a full disk."""

        def __init__(self, path, mode) -> None:
            self.file = builtins.open(path, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.file.close()

        def write(self, data) -> None:
            self.file.write(data[:4096])
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(record, "open", FullDisk, raising=False)
    db = tmp_path / "s" / "mlflow.db"
    db.parent.mkdir()
    with pytest.raises(OSError, match="No space left"):
        record.create_store(db)
    assert list(db.parent.iterdir()) == []


def test_a_first_stores_migrations_print_none_of_mlflows_info_lines(tmp_path, monkeypatch, capfd):
    """Held-out round 16 (H03): MLflow's "Creating initial MLflow database tables..." / "Updating database tables"
    lines in every first command. A process's first store (its migrations: the copies print nothing either way)."""
    monkeypatch.setattr(record, "_EMPTY_STORE", {})
    capfd.readouterr()
    record.create_store(tmp_path / "mlflow.db")
    out, err = capfd.readouterr()
    assert (tmp_path / "mlflow.db").exists() and record._EMPTY_STORE
    for noise in ("Creating initial MLflow database tables", "Updating database tables", "INFO"):
        assert noise not in out + err, out + err
