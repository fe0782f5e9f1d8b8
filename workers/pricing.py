"""Money: prices per model and the cost of one reply's usage."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from workers.usage import Usage

PER_MILLION = 1_000_000


class Price(BaseModel):
    """USD per million tokens, input and output (a misspelt key is an error)."""

    model_config = ConfigDict(extra="forbid")

    input_per_million: float = Field(default=2.00, ge=0)
    output_per_million: float = Field(default=12.00, ge=0)


class PriceTable(BaseModel):
    """Prices by model name; models not listed use `default`."""

    model_config = ConfigDict(extra="forbid")

    default: Price = Price()
    models: dict[str, Price] = {}

    def for_model(self, model: str) -> Price:
        """The price that applies to `model`."""
        return self.models.get(model, self.default)


def cost(usage: Usage, price: Price) -> float:
    """USD for one reply: prompt tokens at the input rate, completion tokens at the output rate."""
    return (
        usage.prompt_tokens * price.input_per_million
        + usage.completion_tokens * price.output_per_million
    ) / PER_MILLION
