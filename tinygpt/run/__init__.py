"""A training run and a model's use: the options a command asks for, the recipe resolved
from them, the start, the loop, its schedule, log and safety, evaluation and sampling."""
