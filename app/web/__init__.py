"""The web layer: plan state in the URL, the view model, figures, the upload store."""
