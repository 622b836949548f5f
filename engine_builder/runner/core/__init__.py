"""The engine core: the contracts between the step loop's stages (model input, step plan, sampler)."""
