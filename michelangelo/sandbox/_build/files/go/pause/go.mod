module michelangelo.local/pause

go 1.22
