"""Loading targets: clear errors for hub ids while offline and for missing paths; aux-layer features."""

import pytest
import torch

from graft_lab.errors import ModelLoadError
from graft_lab.models.target import default_aux_layers, load_model
from tiny import tiny_target


def test_hub_id_offline_says_how_to_get_the_weights():
    with pytest.raises(ModelLoadError) as err:
        load_model("Qwen/Qwen3-8B")
    msg = str(err.value)
    assert "Qwen/Qwen3-8B" in msg and "huggingface-cli download" in msg and "model.path" in msg


@pytest.mark.parametrize("path", ["/nonexistent/model", "./nope", "a/b/c"])
def test_missing_path(path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(path)


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(tmp_path))


def test_unknown_dtype():
    with pytest.raises(ModelLoadError, match="dtype"):
        load_model("embedded:smollm2-135m-instruct", dtype="int3")


def test_default_aux_layers_follow_eagle3():
    assert default_aux_layers(32) == (2, 16, 29)
    assert default_aux_layers(30) == (2, 15, 27)


def test_prefill_and_verify_return_aux_features_of_the_chosen_layers():
    target = tiny_target("llama")
    cache = target.new_cache(64)
    ids = torch.tensor([3, 4, 5, 6])
    out = target.prefill(ids, cache, want_aux=True, all_logits=True)
    assert out.logits.shape == (4, target.vocab_size)
    assert out.aux.shape == (4, 3 * target.hidden_size)
    ref = target.model(ids[None], output_hidden_states=True)
    expect = torch.cat([ref.hidden_states[i][0] for i in target.aux_layers], -1)
    assert torch.allclose(out.aux, expect, atol=1e-5)
    assert torch.allclose(out.logits, ref.logits[0], atol=1e-5)
