"""Other formats: Hugging Face import/export and loading any checkpoint's parameters for inference."""
