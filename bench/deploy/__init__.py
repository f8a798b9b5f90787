"""What a (re)start of a serving process under graphmon run sees: first data, the deploy verdict."""
