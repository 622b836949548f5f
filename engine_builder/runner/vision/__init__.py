"""Images for vision-language engines: loading (bounded), the model's own preprocessing, the vision graph, and the
splice of its features into a prompt (the multimodal pipeline before the step loop)."""
