"""Pipeline topology validation and deploy YAML resolution: overlays, precedence, unknown keys."""

import pytest

from omnistage.config.deploy import resolve_deploy
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.errors import ConfigError, InvalidRequestError
from tests.support.toy_stages import fan_in_pipeline, speech_pipeline

pytestmark = pytest.mark.unit


def write(path, text):
    path.write_text(text)
    return path


def test_pipeline_validation_names_the_problem():
    with pytest.raises(ConfigError, match="input 5 is not a stage"):
        PipelineSpec(
            "p", (StageSpec(0, "a", StageKind.AR, final_output=True, output_modality="text", inputs=(5,)),)
        )
    with pytest.raises(ConfigError, match="cycle"):
        PipelineSpec(
            "p",
            (
                StageSpec(0, "a", StageKind.AR),
                StageSpec(1, "b", StageKind.AR, inputs=(0, 2)),
                StageSpec(2, "c", StageKind.AR, inputs=(1,), final_output=True, output_modality="text"),
            ),
        )
    with pytest.raises(ConfigError, match="final_output"):
        PipelineSpec("p", (StageSpec(0, "a", StageKind.AR),))
    with pytest.raises(ConfigError, match="unique"):
        PipelineSpec(
            "p",
            (
                StageSpec(0, "a", StageKind.AR, final_output=True, output_modality="text"),
                StageSpec(0, "b", StageKind.AR),
            ),
        )


def test_requested_modalities_select_stages():
    pipe = speech_pipeline()
    assert pipe.stages_for(["text"]) == ({0}, {0})
    assert pipe.stages_for(["audio"]) == ({0, 1, 2}, {2})
    assert pipe.stages_for(None) == ({0, 1, 2}, {0, 2})
    with pytest.raises(InvalidRequestError, match="image") as err:
        pipe.stages_for(["image"])
    assert err.value.param == "modalities"


def test_overlay_and_precedence(tmp_path):
    write(
        tmp_path / "base.yaml",
        """
async_chunk: false
dtype: float32
stages:
  - stage_id: 0
    max_num_seqs: 8
    engine_args: {a: 1, b: 1}
  - stage_id: 1
    placement: inline
""",
    )
    overlay = write(
        tmp_path / "overlay.yaml",
        """
base_config: base.yaml
stages:
  - stage_id: 0
    max_num_seqs: 16
    engine_args: {b: 2}
""",
    )
    pipe = speech_pipeline()
    deploy = resolve_deploy(pipe, overlay)
    s0 = deploy.stage(0)
    assert s0.max_num_seqs == 16  # overlay beats base
    assert s0.engine_args == {"a": 1, "b": 2}  # dict fields merge key by key
    assert s0.dtype == "float32"  # pipeline-wide value from the base file
    assert deploy.stage(1).placement == "inline"
    assert deploy.async_chunk is False
    assert deploy.stage(2).engine_args["chunk_size"] == 2  # pipeline default survives

    deploy = resolve_deploy(
        pipe,
        overlay,
        cli={"max_num_seqs": 4, "dtype": "bfloat16"},
        stage_overrides='{"0": {"max_num_seqs": 2}}',
    )
    assert deploy.stage(0).max_num_seqs == 2  # per-stage CLI beats CLI flag
    assert deploy.stage(1).max_num_seqs == 4  # CLI flag beats YAML and defaults
    assert deploy.stage(0).dtype == "bfloat16"  # CLI flag beats YAML


def test_unknown_keys_name_key_and_file(tmp_path):
    """A misspelled key names itself, the stage, the file and the key meant."""
    bad = write(tmp_path / "bad.yaml", "stages:\n  - stage_id: 0\n    max_num_seq: 3\n")
    meant = r"unknown key 'max_num_seq' in stages\[0\] \(stage 0\) of .*bad.yaml; did you mean 'max_num_seqs'"
    with pytest.raises(ConfigError, match=meant):
        resolve_deploy(speech_pipeline(), bad)
    top = write(tmp_path / "top.yaml", "stage_args: []\n")
    with pytest.raises(ConfigError, match=r"unknown key 'stage_args' in .*top.yaml"):
        resolve_deploy(speech_pipeline(), top)
    with pytest.raises(ConfigError, match="unknown key 'nope' in --stage-overrides"):
        resolve_deploy(speech_pipeline(), None, stage_overrides={"1": {"nope": 1}})
    with pytest.raises(ConfigError, match="stage 7"):
        resolve_deploy(speech_pipeline(), None, stage_overrides={"7": {"max_num_seqs": 1}})
    with pytest.raises(ConfigError, match="placement"):
        resolve_deploy(speech_pipeline(), None, cli={"placement": "cloud"})
    settle = r"core_sharing.burst_settle_ms must be a number of milliseconds in \[0, 20\]"
    with pytest.raises(ConfigError, match=settle):
        resolve_deploy(
            speech_pipeline(), None, stage_overrides={"1": {"core_sharing": {"burst_settle_ms": 50}}}
        )
    quick = {"1": {"core_sharing": {"burst_settle_ms": 0}}}
    assert (
        resolve_deploy(speech_pipeline(), None, stage_overrides=quick).stage(1).core_sharing.burst_settle_ms
        == 0
    )


def test_connectors_and_async_edges(tmp_path):
    cfg = write(
        tmp_path / "c.yaml",
        """
connectors:
  fast: {type: shm}
stages:
  - stage_id: 1
    input_connectors: {from_stage_0: fast}
  - stage_id: 2
    input_connectors: {from_stage_1: socket}
    async_chunk: false
""",
    )
    pipe = speech_pipeline()
    deploy = resolve_deploy(pipe, cfg)
    assert deploy.stage(1).connector_from(0, deploy.connectors) == {"type": "shm"}
    assert deploy.stage(2).connector_from(1, deploy.connectors) == {"type": "socket"}
    assert deploy.edge_async(pipe, 1) and not deploy.edge_async(pipe, 2)
    missing = write(
        tmp_path / "m.yaml", "stages:\n  - stage_id: 1\n    input_connectors: {from_stage_0: nope}\n"
    )
    with pytest.raises(ConfigError, match="connector 'nope' is not defined"):
        resolve_deploy(pipe, missing)
    assert not resolve_deploy(fan_in_pipeline()).edge_async(fan_in_pipeline(), 2)


def test_deploy_limits_lower_or_raise_the_pipeline_limits(tmp_path):
    from omnistage.config.capabilities import Capabilities, Limits

    caps = Capabilities(
        routes=("images",), prompt="text", fields={"diffusion": (0,)}, limits=Limits(max_steps=50)
    )
    spec = PipelineSpec(
        "limited",
        (StageSpec(0, "dit", StageKind.DIFFUSION, final_output=True, output_modality="image"),),
        capabilities=caps,
    )
    assert resolve_deploy(spec).limits == Limits(max_steps=50)
    base = tmp_path / "base.yaml"
    base.write_text("limits:\n  max_steps: 10\n  max_pixels: 4096\n")
    over = tmp_path / "over.yaml"
    over.write_text("base_config: base.yaml\nlimits:\n  max_steps: 200\n")
    assert resolve_deploy(spec, over).limits == Limits(max_steps=200, max_pixels=4096)
    bad = tmp_path / "bad.yaml"
    bad.write_text("limits:\n  max_pixel: 10\n")
    with pytest.raises(ConfigError, match="unknown key 'max_pixel' in limits of .*bad.yaml"):
        resolve_deploy(spec, bad)
    with pytest.raises(ConfigError, match="limits.max_steps must be > 0"):
        resolve_deploy(spec, {"limits": {"max_steps": 0}})
    with pytest.raises(ConfigError, match="capabilities.fields\\['diffusion'\\] names stage 3"):
        PipelineSpec(
            "x", spec.stages, capabilities=Capabilities(routes=("images",), fields={"diffusion": (3,)})
        )


def test_capabilities_are_derived_when_a_pipeline_declares_none():
    caps = speech_pipeline().capabilities
    assert caps.prompt == "chat" and caps.serves("chat") and caps.serves("speech")
    assert caps.stages_for("sampling") == (0,)
    image = PipelineSpec(
        "img", (StageSpec(0, "dit", StageKind.DIFFUSION, final_output=True, output_modality="image"),)
    )
    assert image.capabilities.prompt == "text" and image.capabilities.routes == ("chat", "images")
    assert image.capabilities.stages_for("diffusion") == (0,)
