"""The tables: packaged datasets, a party's own table and files, partitions, what a trained model leaves."""
