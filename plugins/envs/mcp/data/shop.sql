-- A small shop for the mcp:sqlite demo env: customers, products, orders and their items.
-- Prices are whole dollars. omrl builds a database from this file at first use (in the temp dir).
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    city TEXT NOT NULL,
    joined TEXT NOT NULL  -- ISO date
);
CREATE TABLE products (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    category TEXT NOT NULL,
    price INTEGER NOT NULL  -- dollars
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    order_date TEXT NOT NULL,  -- ISO date
    status TEXT NOT NULL  -- shipped, pending or cancelled
);
CREATE TABLE order_items (
    order_id INTEGER NOT NULL REFERENCES orders(id),
    product_id INTEGER NOT NULL REFERENCES products(id),
    quantity INTEGER NOT NULL
);

INSERT INTO customers VALUES
    (1, 'Alice', 'Boston', '2023-02-14'),
    (2, 'Bob', 'Chicago', '2023-05-03'),
    (3, 'Carol', 'Boston', '2023-07-21'),
    (4, 'Dave', 'Denver', '2023-09-09'),
    (5, 'Erin', 'Chicago', '2024-01-12'),
    (6, 'Frank', 'Seattle', '2024-02-28'),
    (7, 'Grace', 'Denver', '2024-03-15'),
    (8, 'Heidi', 'Seattle', '2024-04-01');

INSERT INTO products VALUES
    (1, 'Notebook', 'stationery', 4),
    (2, 'Fountain Pen', 'stationery', 35),
    (3, 'Desk Lamp', 'home', 42),
    (4, 'Teapot', 'kitchen', 28),
    (5, 'Chef Knife', 'kitchen', 60),
    (6, 'Headphones', 'electronics', 120),
    (7, 'Keyboard', 'electronics', 75),
    (8, 'Plant Pot', 'home', 12),
    (9, 'Coffee Grinder', 'kitchen', 55),
    (10, 'Backpack', 'travel', 80);

INSERT INTO orders VALUES
    (1, 1, '2024-01-05', 'shipped'),
    (2, 2, '2024-01-09', 'shipped'),
    (3, 1, '2024-01-22', 'shipped'),
    (4, 3, '2024-02-02', 'shipped'),
    (5, 4, '2024-02-11', 'cancelled'),
    (6, 2, '2024-02-19', 'shipped'),
    (7, 5, '2024-03-01', 'shipped'),
    (8, 1, '2024-03-08', 'pending'),
    (9, 6, '2024-03-17', 'shipped'),
    (10, 7, '2024-03-25', 'shipped'),
    (11, 3, '2024-04-04', 'pending'),
    (12, 4, '2024-04-12', 'shipped'),
    (13, 2, '2024-04-20', 'cancelled'),
    (14, 5, '2024-05-02', 'shipped'),
    (15, 7, '2024-05-14', 'pending'),
    (16, 4, '2024-05-30', 'shipped');

INSERT INTO order_items VALUES
    (1, 1, 3), (1, 2, 1),
    (2, 6, 1),
    (3, 4, 2), (3, 8, 4),
    (4, 3, 1),
    (5, 10, 1),
    (6, 7, 1), (6, 1, 5),
    (7, 5, 1), (7, 9, 1),
    (8, 6, 2),
    (9, 8, 3),
    (10, 2, 2), (10, 4, 1),
    (11, 9, 1),
    (12, 3, 2), (12, 7, 1),
    (13, 5, 1),
    (14, 1, 10),
    (15, 10, 1), (15, 8, 2),
    (16, 6, 1);
