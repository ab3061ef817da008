"""Reports of a comparison: derived metrics, figures and tables read from MLflow only."""
