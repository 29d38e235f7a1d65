module michelangelo.local/runc-capfilter

go 1.22
