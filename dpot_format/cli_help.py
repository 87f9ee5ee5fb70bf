"""What `dpot-data` and `dpot-train` share in their help: flags shown without a type, `--version`, and the root
app built the same way (`root_app`).

typer prints a value type beside every option, `<bool>` on on/off flags included; a flag takes no value, so its
help reads better without one. Kept here because both command lines import dpot_format and nothing else in common.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

DISTRIBUTION = "dpot"


def tidy_params(command: Any) -> None:
    """Flags of `command` and of every command below it, --help included, show no value type (idempotent)."""
    if getattr(command, "_tidy", False):
        return
    command._tidy = True
    for param in command.params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    plain_help_option = command.get_help_option

    def get_help_option(ctx: Any) -> Any:
        option = plain_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = get_help_option
    for sub in (getattr(command, "commands", None) or {}).values():
        tidy_params(sub)


class TidyGroup(TyperGroup):
    """The root group of a command line: it and every command it hands out have tidy flags (`tidy_params`)."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        tidy_params(self)
        return super().get_command(ctx, cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        tidy_params(self)
        super().format_help(ctx, formatter)


def package_version() -> str:
    """The installed distribution's version (package metadata), else the source tree's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        from dpot_format import __version__

        return __version__


def add_version_option(app: typer.Typer, prog: str) -> None:
    """`PROG --version`: print `PROG VERSION` and exit 0, whatever else is given."""

    def show(value: bool) -> None:
        if value:
            typer.echo(f"{prog} {package_version()}")
            raise typer.Exit()

    @app.callback()
    def root(version: bool = typer.Option(False, "--version", callback=show, is_eager=True, metavar="",
                                          help="Print the version (from the installed package) and exit.")) -> None:
        """Root options."""


def root_app(prog: str, help_text: str) -> typer.Typer:
    """The root of a command line: no-args help, no completion or pretty tracebacks, tidy flags, `--version`."""
    app = typer.Typer(name=prog, help=help_text, no_args_is_help=True, add_completion=False,
                      pretty_exceptions_enable=False, cls=TidyGroup)
    add_version_option(app, prog)
    return app
