"""``michelangelo models list/show/alias`` against a real registry folder."""

import json

import torch
from click.testing import CliRunner

from michelangelo.cli._main import cli
from michelangelo.lib.model_registry import ModelRegistry


def _registry(tmp_path) -> str:
    root = str(tmp_path / "registry")
    registry = ModelRegistry(root)
    for value in (1.0, 2.0):
        registry.register("proj", "mlp", state_dict={"w": torch.full((2,), value)},
                          metrics={"val_loss": 1 / value}, description=f"value {value}",
                          lineage={"note": "cli"})
    registry.register("proj", "other", state_dict={"w": torch.zeros(1)})
    return root


def test_models_list_show_alias(tmp_path):
    root = _registry(tmp_path)
    runner = CliRunner(env={"COLUMNS": "250"})
    out = runner.invoke(cli, ["models", "list", "--registry", root])
    assert out.exit_code == 0, out.output
    assert "proj" in out.output and "mlp" in out.output and "other" in out.output

    out = runner.invoke(cli, ["models", "alias", "proj/mlp", "champion", "1", "--registry", root])
    assert out.exit_code == 0, out.output
    assert "proj/mlp@champion -> 1" in out.output
    out = runner.invoke(cli, ["models", "alias", "proj/mlp", "champion", "2", "--registry", root])
    assert out.exit_code == 0, out.output

    out = runner.invoke(cli, ["models", "list", "proj", "--registry", root])
    assert out.exit_code == 0, out.output
    assert "@champion" in out.output and "val_loss=0.5" in out.output

    out = runner.invoke(cli, ["models", "show", "proj/mlp@champion", "--registry", root])
    assert out.exit_code == 0, out.output
    assert "proj/mlp:2" in out.output and "value 2.0" in out.output
    assert "note: cli" in out.output and "alias history" in out.output

    out = runner.invoke(cli, ["models", "show", "proj/mlp:1", "--json", "--registry", root])
    data = json.loads(out.output)
    assert data["revision_id"] == 1 and data["aliases"] == []
    assert [(h["from"], h["to"]) for h in data["alias_history"]] == [(None, 1), (1, 2)]


def test_models_errors_are_one_line(tmp_path):
    root = _registry(tmp_path)
    runner = CliRunner(env={"COLUMNS": "250"})
    out = runner.invoke(cli, ["models", "show", "proj/mlp:9", "--registry", root])
    assert out.exit_code == 1
    assert "RevisionNotFoundError" in out.output and "no revision 9" in out.output
    out = runner.invoke(cli, ["models", "alias", "proj/mlp", "champion", "7", "--registry", root])
    assert out.exit_code == 1 and "no revision 7" in out.output
    out = runner.invoke(cli, ["models", "show", "nonsense", "--registry", root])
    assert out.exit_code == 1 and "malformed" in out.output
