"""Windows over the feature store, participant splits and the Lightning datamodule."""
