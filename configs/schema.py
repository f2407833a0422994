"""The root of the typed config tree. Each actor receives only its own section."""
from __future__ import annotations

from dataclasses import dataclass

from configs.env import EnvConfig
from configs.fields import spec
from configs.generation import GeneratorConfig, ModelConfig, RolloutConfig
from configs.learner import AlgorithmConfig, LearnerConfig
from configs.run import CheckpointConfig, EvalConfig, LoggingConfig, RayConfig, TrainerConfig, TransportConfig


@dataclass
class RootConfig:
    model: ModelConfig = spec(ModelConfig())
    """The policy model."""
    env: EnvConfig = spec(EnvConfig())
    """Environments and env-pool actors."""
    rollout: RolloutConfig = spec(RolloutConfig())
    """The multi-turn rollout loop."""
    generator: GeneratorConfig = spec(GeneratorConfig())
    """vLLM generator actors."""
    learner: LearnerConfig = spec(LearnerConfig())
    """DeepSpeed learner actors."""
    algorithm: AlgorithmConfig = spec(AlgorithmConfig())
    """Loss, advantage estimator and horizon schedule."""
    trainer: TrainerConfig = spec(TrainerConfig())
    """The coordinator's run loop."""
    checkpoint: CheckpointConfig = spec(CheckpointConfig())
    """Checkpoints and resume."""
    transport: TransportConfig = spec(TransportConfig())
    """ZeroMQ channels."""
    logging: LoggingConfig = spec(LoggingConfig())
    """Metrics, wandb and the progress bar."""
    ray: RayConfig = spec(RayConfig())
    """Ray cluster."""
    eval: EvalConfig = spec(EvalConfig())
    """Evaluation."""

    def validate(self) -> list[tuple[str, str]]:
        """Constraints between sections (each section checks its own)."""
        problems = []
        if self.generator.kv_cache_max_age > self.trainer.max_staleness:
            problems.append(("generator.kv_cache_max_age", (
                f"at most trainer.max_staleness ({self.trainer.max_staleness}), got "
                f"{self.generator.kv_cache_max_age}: a cached key or value older than that would make the tokens "
                "sampled on it staler than the run allows")))
        return problems
