"""mkdocs hook: the `pipeinfer` click group, every subcommand in it, for the generated
command-line reference (docs/reference/cli.md).

The group is `pipeinfer.cli:main` where that is the click group itself, else the group
`pipeinfer.cli.commands:commands` that the console script `main()` runs. It loads `serve`,
`calibrate`, `plan` and `simulate` only when asked for (its `list_commands`/`get_command`),
while mkdocs-click documents a group's `commands` as it finds them; so each command the group
lists is looked up once and registered, as `pipeinfer --help` lists them. The group is then
the module `pipeinfer_cli_reference` (attribute `cli`) that the page's `::: mkdocs-click`
block names.
"""

import importlib
import sys
import types

import click


def cli_group() -> click.Group:
    """The click group behind `pipeinfer`, with every subcommand registered."""
    main = importlib.import_module("pipeinfer.cli").main
    if not isinstance(main, click.Group):
        main = importlib.import_module("pipeinfer.cli.commands").commands
    ctx = click.Context(main, info_name="pipeinfer")
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        if command is None:
            raise click.ClickException(f"pipeinfer {name}: listed but not found")
        main.add_command(command, name)
    return main


def on_config(config, **kwargs):
    module = types.ModuleType("pipeinfer_cli_reference", "The `pipeinfer` group, for mkdocs-click.")
    module.cli = cli_group()
    sys.modules[module.__name__] = module
    return config
