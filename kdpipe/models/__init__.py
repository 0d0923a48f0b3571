"""Models: backbones and their loading (shared by teachers and students), student architectures, inference."""
