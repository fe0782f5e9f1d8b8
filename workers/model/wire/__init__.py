"""The wire formats the model client speaks: OpenAI chat completions and Anthropic Messages,
and the request settings and reply they share."""
