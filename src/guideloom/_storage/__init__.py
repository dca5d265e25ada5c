"""The storages users create (TokenStorage, DocumentStorage) and the bookkeeping of resumable writes."""
