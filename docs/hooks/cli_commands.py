"""mkdocs hook: every subcommand of `pipeinfer` in the generated command-line reference.

`pipeinfer.cli:main` imports `serve`, `calibrate`, `plan` and `simulate` only when asked for
(its `list_commands`/`get_command`), while mkdocs-click documents a group's `commands` as it
finds them, so those four would be missing. Before the pages are built, each command the
group lists is looked up once and registered, as `pipeinfer --help` lists them.
"""

import click


def on_config(config, **kwargs):
    from pipeinfer.cli import main

    ctx = click.Context(main, info_name="pipeinfer")
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        if command is None:
            raise click.ClickException(f"pipeinfer {name}: listed but not found")
        main.add_command(command, name)
    return config
