"""The one shared training loop (teachers, students, co-training) and what it optimises."""
