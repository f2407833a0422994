"""Pure building blocks: wire types and codec, ZeroMQ transport, env and policy interfaces, horizon schedule,
advantages, loss, staleness gate, checkpoint layout. Never imports ray, vllm or deepspeed."""
