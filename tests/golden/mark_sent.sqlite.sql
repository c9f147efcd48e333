UPDATE outbox SET available_at=?, published_at=?, publish_count=(outbox.publish_count + ?) WHERE outbox.id = ? AND outbox.publish_count = ? AND outbox.dead_at IS NULL;
