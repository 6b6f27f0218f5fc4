"""Database helpers shared by the auth and billing stores."""
