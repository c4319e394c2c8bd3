"""Reading Kafka traffic from packet captures: capture formats, TCP reassembly, frame resync, feeding sessions."""
