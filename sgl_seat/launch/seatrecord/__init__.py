"""A seat's local record: sgl-seat's home, the record file, the life-cycle enum, and its Ray names."""
