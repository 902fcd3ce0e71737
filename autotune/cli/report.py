"""``autotune report`` (an HTML report and a Markdown summary of a study) and ``autotune
dashboard`` (optuna-dashboard on the study's database): plain functions over
:mod:`autotune.report` (docs/report.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import typer

from autotune.cli._app import app, console
from autotune.cli.database import StorageOpt, need_study, study_store
from autotune.errors import ConfigError, MissingExtraError
from autotune.store.optuna_ids import study_id
from autotune.tuning.run.create import load_study_config
from autotune.tuning.study_attrs import stored_noise

__all__ = ["dashboard", "report"]


def _need_extra(what: str, module: str) -> Any:
    """Import ``module`` from the ``[report]`` extra, or one line naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or module).split(".")[0]
        raise MissingExtraError(what, "report", missing) from exc


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write ({exc.strerror or exc})") from exc


@app.command("report")
def report(
    name: Annotated[str, typer.Argument(help="study name")],
    html: Annotated[
        Path | None, typer.Option("--html", help="write the HTML report (self-contained)")
    ] = None,
    md: Annotated[Path | None, typer.Option("--md", help="write the Markdown summary")] = None,
    storage: StorageOpt = None,
) -> None:
    """A study's report: one self-contained HTML file with plots (--html) and a Markdown
    summary for pull requests and chat (--md). Reads the database only."""
    if html is None and md is None:
        raise typer.BadParameter("give --html FILE, --md FILE or both", param_hint="'--html'")
    render_html = None
    if html is not None:
        render_html = _need_extra("autotune report --html", "autotune.report.html").render_html
    from autotune.report.notes import markdown_report
    from autotune.report.study_view import study_view

    with study_store(storage, name) as store:
        rec = need_study(store, name)
        view = study_view(
            rec,
            load_study_config(rec),
            store.trials(name),
            store.repeats(name),
            stored_noise(store, name),
        )
    out = console()
    if html is not None and render_html is not None:
        text = render_html(view)
        _write(html, text)
        out.print(f"wrote {html} ({len(text.encode()) / 1e6:.1f} MB, self-contained)")
    if md is not None:
        text = markdown_report(view)
        _write(md, text)
        out.print(f"wrote {md} ({len(text.encode()) / 1e3:.1f} kB)")


class _Threaded(WSGIServer):
    """wsgiref answering each request in a thread (the dashboard asks several at once)."""

    daemon_threads = True

    def process_request(self, request: Any, client_address: Any) -> None:
        import threading

        def serve() -> None:
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)

        threading.Thread(target=serve, daemon=True).start()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per API call would bury the URL


@app.command("dashboard")
def dashboard(
    name: Annotated[str, typer.Argument(help="study name")],
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="port to listen on")] = 8080,
    host: Annotated[
        str, typer.Option("--host", help="address to listen on (127.0.0.1: this machine only)")
    ] = "127.0.0.1",
    storage: StorageOpt = None,
) -> None:
    """Serve optuna-dashboard on the study's database, first bringing the study's notes
    and plots up to date. Ctrl-C stops it."""
    dash = _need_extra("autotune dashboard", "optuna_dashboard")
    _need_extra("autotune dashboard", "plotly")
    import optuna

    from autotune.report.dashboard import refresh

    with study_store(storage, name) as store:
        rec = need_study(store, name)
        storage_obj = store.optuna_storage()
        study = optuna.load_study(study_name=rec.optuna_study_name, storage=storage_obj)
        refresh(study, load_study_config(rec), rec, store.trials(name), store.repeats(name))
        try:
            httpd = make_server(
                host,
                port,
                dash.wsgi(storage_obj),
                server_class=_Threaded,
                handler_class=_QuietHandler,
            )
        except OSError as exc:
            raise ConfigError(
                f"--port {port}: cannot listen on {host}:{port} ({exc.strerror or exc})"
            ) from exc
        where = store.url.split("@")[-1]
        url = f"http://{host}:{port}/dashboard/studies/{study_id(study)}"
        console().print(f"optuna-dashboard on {where}: study {name!r} at {url} (Ctrl-C stops it)")
        sys.stdout.flush()
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            httpd.server_close()
